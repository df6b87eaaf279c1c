"""The run config: every package's sections assembled, plus the checks that span sections.

``load_config(path, overrides)`` reads YAML plus ``key.sub=value`` overrides and validates it;
a problem is a one-line ``ConfigError`` (the CLI prints it and exits 2).
``config_table()`` is docs/config.md's table of every key (``sao config --markdown``).
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from core.config import ConfigError, RunConfig, Section, dump_yaml, load_yaml, validate
from envs.config import DockerConfig, SandboxConfig
from eval.config import EvalConfig
from harness.config import (
    AgentConfig,
    EngineConfig,
    ModelConfig,
    ProxyConfig,
    RolloutConfig,
    SamplingConfig,
)
from tasks.config import TasksConfig
from trainer.config import SFTConfig, TrainerConfig, ValuePretrainConfig
from trainer.gpu_plan import plan as gpu_plan

__all__ = ["Config", "ConfigError", "config_table", "dump_config", "load_config"]


# The bundled tasks split by task within each code base (sao learn): the two with the shortest expert
# episodes train, the next one is held out.
LEARN_TRAIN = ["sao-harness__minicfg-8", "sao-harness__minicfg-14", "sao-harness__semverkit-34",
               "sao-harness__semverkit-31", "sao-harness__spanlib-5", "sao-harness__spanlib-8",
               "sao-harness__tablefmt-13", "sao-harness__tablefmt-9"]
LEARN_HELDOUT = ["sao-harness__minicfg-11", "sao-harness__semverkit-38", "sao-harness__spanlib-19",
                 "sao-harness__tablefmt-16"]
ARMS = ("sao", "grpo+dis", "grpo")


class LearnConfig(Section):
    """`sao learn`: expert traces -> SFT warm start -> SAO, GRPO+DIS and GRPO for the same wall time -> eval."""

    train_tasks: list[str] = Field(LEARN_TRAIN, description="tasks of the expert traces, SFT and RL (and the "
                                   "headline resolved@1)")
    heldout_tasks: list[str] = Field(LEARN_HELDOUT, description="tasks only evaluated, never trained on")
    samples: int = Field(4, gt=0, description="episodes per task and policy in each evaluation (T = "
                         "eval.temperature); resolved@1 is their mean")
    minutes: float = Field(8.0, gt=0, description="wall-clock training budget of each RL run (trainer.max_minutes)")
    value_episodes: int = Field(8, ge=0, description="sao arm: episodes per training task sampled from the warm "
                                "start for value pretraining (`sao value-pretrain`), a stage of its own before the "
                                "arms, timed and reported beside them (every arm gets learn.minutes of RL); 0 = the "
                                "critic starts from the warm start")
    arms: list[Literal["sao", "grpo+dis", "grpo"]] = Field(list(ARMS), description="the RL runs, each from the "
                                                          "same warm start: sao = the trainer section as configured; "
                                                          "grpo+dis / grpo = sync groups, GRPO advantages, DIS / "
                                                          "the PPO clip")


DEMO_TASKS = ["sao-harness__minicfg-8", "sao-harness__semverkit-34", "sao-harness__spanlib-5",
              "sao-harness__tablefmt-13"]


class DemoConfig(Section):
    """`sao demo`: the learning test-bed, then the real path (expert traces -> SFT -> SAO -> eval), in minutes."""

    toy_config: str = Field("configs/learn-toy.yaml", description="the learning test-bed's config (trainer.env toy)")
    toy_steps: int = Field(30, gt=0, description="SAO steps on the test-bed (trainer.max_steps)")
    tasks: list[str] = Field(DEMO_TASKS, description="bundled tasks of the real path: expert traces, SFT, SAO and eval")
    sft_steps: int = Field(300, gt=0, description="SFT warm-start steps on the expert traces (sft.max_steps)")
    sao_minutes: float = Field(1.5, gt=0, description="wall-clock budget of the SAO run from the warm start "
                               "(trainer.max_minutes)")
    samples: int = Field(2, gt=0, description="episodes per task and policy at eval.temperature in each evaluation")


class ClusterConfig(Section):
    """The GPU nodes a run is given: `sao config` prints the GPU plan on them and any command refuses a plan
    that does not fit (trainer.gpu_plan)."""

    nodes: int = Field(0, ge=0, description="GPU nodes for the trainer ranks and the engine replicas together; 0 = "
                       "none described (no GPU plan)")
    gpus_per_node: int = Field(8, gt=0, description="GPUs on each node")
    gpu_memory_bytes: int = Field(80 * 2**30, gt=0, description="memory of one GPU in bytes (an 80 GB card: "
                                  "80 GiB); the trainer may use 0.9 of it, the engine gpu_memory_utilization")
    host_memory_bytes: int | None = Field(None, gt=0, description="host memory of a trainer node in bytes, for "
                                          "the offloaded optimizer state; null = not checked")


class Config(Section):
    """The run config: one section per area; ``sao config`` prints it."""

    run: RunConfig = RunConfig()
    model: ModelConfig = ModelConfig()
    engine: EngineConfig = EngineConfig()
    sampling: SamplingConfig = SamplingConfig()
    proxy: ProxyConfig = ProxyConfig()
    agent: AgentConfig = AgentConfig()
    rollout: RolloutConfig = RolloutConfig()
    docker: DockerConfig = DockerConfig()
    sandbox: SandboxConfig = SandboxConfig()
    tasks: TasksConfig = TasksConfig()
    trainer: TrainerConfig = TrainerConfig()
    value_pretrain: ValuePretrainConfig = ValuePretrainConfig()
    sft: SFTConfig = SFTConfig()
    eval: EvalConfig = EvalConfig()
    learn: LearnConfig = LearnConfig()
    cluster: ClusterConfig = ClusterConfig()
    demo: DemoConfig = DemoConfig()

    @model_validator(mode="after")
    def _trainer_samples_like_the_engine(self) -> Config:
        """The trainer recomputes logprobs under the rollout's sampling distribution (docs/algorithm.md)."""
        for key in ("temperature", "top_p", "top_k"):
            rollout = getattr(self.sampling, key)
            mine = getattr(self.trainer, key)
            if key not in self.trainer.model_fields_set:
                object.__setattr__(self.trainer, key, rollout)
            elif mine != rollout:
                raise ValueError(f"trainer.{key} ({mine}) differs from sampling.{key} ({rollout}): "
                                 "the ratio to the rollout would not be 1 on-policy")
        return self


    @model_validator(mode="after")
    def _gpu_plan_fits(self) -> Config:
        """The trainer ranks and engine replicas fit the cluster.* nodes (trainer.gpu_plan; no nodes: no check)."""
        gpu_plan(self)
        return self


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Config from ``path`` (YAML) with ``key.sub=value`` overrides applied on top."""
    data, source = load_yaml(path, overrides)
    return validate(Config, data, source)


def dump_config(cfg: Config) -> str:
    """The config as YAML, every key with its value."""
    return dump_yaml(cfg)


def config_keys(model: BaseModel, prefix: str = "") -> Iterator[tuple[str, Any, str]]:
    """``(dotted key, value, description)`` of every leaf key of ``model``, in declaration order."""
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            yield from config_keys(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", value, field.description or ""


def _yaml_value(value: Any) -> str:
    """A default as it is written in a config file: ``local``, ``null``, ``true``, ``[]``, ``1e-06``."""
    value = str(value) if isinstance(value, Path) else value
    if isinstance(value, str) and value:
        return value
    return json.dumps(value)


def config_table(cfg: Config | None = None) -> str:
    """The markdown table ``| key | default | description |`` of every key (default: the built-in defaults)."""
    rows = ["| key | default | description |", "|---|---|---|"]
    for key, value, description in config_keys(cfg if cfg is not None else Config()):
        rows.append(f"| `{key}` | `{_yaml_value(value)}` | {description.replace('|', chr(92) + '|')} |")
    return "\n".join(rows) + "\n"
