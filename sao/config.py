"""The run config: every package's sections assembled, plus the checks that span sections.

``load_config(path, overrides)`` reads YAML plus ``key.sub=value`` overrides and validates it;
a problem is a one-line ``ConfigError`` (the CLI prints it and exits 2).
"""
from __future__ import annotations

from pathlib import Path

from pydantic import model_validator

from core.config import ConfigError, RunConfig, Section, dump_yaml, load_yaml, validate
from envs.config import DockerConfig, SandboxConfig
from eval.config import EvalConfig
from harness.config import (AgentConfig, EngineConfig, ModelConfig, ProxyConfig, RolloutConfig,
                            SamplingConfig)
from tasks.config import TasksConfig
from trainer.config import TrainerConfig, ValuePretrainConfig

__all__ = ["Config", "ConfigError", "load_config", "dump_config"]


class Config(Section):
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
    eval: EvalConfig = EvalConfig()

    @model_validator(mode="after")
    def _trainer_samples_like_the_engine(self) -> "Config":
        """The trainer recomputes logprobs under the rollout's sampling distribution (sao.md section 8)."""
        for key in ("temperature", "top_p", "top_k"):
            rollout = getattr(self.sampling, key)
            mine = getattr(self.trainer, key)
            if key not in self.trainer.model_fields_set:
                object.__setattr__(self.trainer, key, rollout)
            elif mine != rollout:
                raise ValueError(f"trainer.{key} ({mine}) differs from sampling.{key} ({rollout}): "
                                 "the ratio to the rollout would not be 1 on-policy")
        return self


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Config from ``path`` (YAML) with ``key.sub=value`` overrides applied on top."""
    data, source = load_yaml(path, overrides)
    return validate(Config, data, source)


def dump_config(cfg: Config) -> str:
    return dump_yaml(cfg)
