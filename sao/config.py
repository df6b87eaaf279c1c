"""The run config: every package's sections assembled, plus the checks that span sections.

``load_config(path, overrides)`` reads YAML plus ``key.sub=value`` overrides and validates it;
a problem is a one-line ``ConfigError`` (the CLI prints it and exits 2).
``config_table()`` is the README's table of every key (``sao config --markdown``).
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, model_validator

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

__all__ = ["Config", "ConfigError", "config_table", "dump_config", "load_config"]


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
