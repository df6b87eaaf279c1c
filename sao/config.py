"""The run config: every package's sections assembled, plus the checks that span sections.

``load_config(path, overrides)`` reads YAML plus ``key.sub=value`` overrides and validates it;
a problem is a one-line ``ConfigError`` (the CLI prints it and exits 2).
``config_table()`` is docs/config.md's table of every key (``sao config --markdown``).
"""
from __future__ import annotations

import copy
import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from sao_harness.core.config import Section, dump_yaml, load_yaml, validate
from sao_harness.eval.config import EvalConfig
from sao_harness.harness.config import HarnessConfig
from sao_harness.harness.engines import registry
from sao_harness.harness.engines.config import DEFAULT_KIND, EngineBase
from sao_harness.harness.testbeds.config import SimulatedConfig
from sao_harness.trainer.config import (
    FLOAT16_UNSUPPORTED,
    ClusterConfig,
    RuntimeConfig,
    SFTConfig,
    TrainerConfig,
    ValuePretrainConfig,
)
from sao_harness.trainer.gpu_plan import plan as gpu_plan

__all__ = ["MOVED_KEYS", "Config", "config_table", "dump_config", "load_config"]

# Keys that moved to another section: the old key still loads, until the version named beside it, with a
# FutureWarning naming the new one; set together with the new key to another value, it is an error.
# {old key: (new key, version that removes the old key)}; `a.b.*`: every key under a.b (the mapping goes)
MOVED_KEYS = {
    **{f"trainer.{k}": (f"sampling.{k}", "0.2.0") for k in ("temperature", "top_k", "top_p")},  # issue 28
    **{f"trainer.{k}": (f"runtime.{k}", "0.2.0") for k in (
        "ray_address", "world_size", "device", "offload_optimizer", "weight_sync", "weight_bucket_mb",
        "weight_sync_host", "keep_checkpoints", "poll_interval_s", "batch_timeout_s", "publish_timeout_s",
        "actor_timeout_s")},
    **{f"trainer.toy_{k}": (f"testbed.toy.{k}", "0.2.0") for k in ("turns", "target", "repeat", "stakes")},
    **{f"trainer.sim_{k}": (f"testbed.simulated.{k}", "0.2.0") for k in SimulatedConfig.model_fields},
    **{f"eval.grade_{k}": (f"grading.{k}", "0.2.0") for k in ("timeout_s", "output_cap_bytes")},  # issue 38
    "eval.guard": ("grading.guard", "0.2.0"),
    "engine.options.*": ("engine.*", "0.2.0"),  # a kind's own keys beside the common ones (EngineSpec.config)
}
_UNSET = object()


def _node(data, path: list[str]):
    """``data[path[0]][path[1]]...``; None where a step is missing or not a mapping."""
    for name in path:
        data = data.get(name) if isinstance(data, dict) else None
    return data


def _moves(data: dict) -> Iterator[tuple[str, str, str]]:
    """``(old, new, removed_in)`` of MOVED_KEYS, an ``a.b.*`` entry once per key ``data`` holds under ``a.b``."""
    for old, (new, removed_in) in MOVED_KEYS.items():
        if not old.endswith(".*"):
            yield old, new, removed_in
            continue
        held = _node(data, old[:-2].split("."))
        for key in list(held) if isinstance(held, dict) else ():
            yield f"{old[:-1]}{key}", f"{new[:-1]}{key}", removed_in


def move_keys(data: dict) -> dict:
    """A copy of ``data`` with every old key of MOVED_KEYS at its new place (a FutureWarning each).

    An old key beside its new key is an error when the two values differ (one would win silently)."""
    data = copy.deepcopy(data)
    moved_from = set()
    for old, new, removed_in in list(_moves(data)):
        *old_parents, old_key = old.split(".")
        section = _node(data, old_parents)
        if not isinstance(section, dict) or old_key not in section:
            continue
        value = section.pop(old_key)
        moved_from.add(".".join(old_parents))
        *parents, key = new.split(".")
        node = data
        for name in parents:
            node = node.setdefault(name, {}) if isinstance(node, dict) else None
        if not isinstance(node, dict):  # e.g. `runtime: 3`: its own validation says what is wrong
            continue
        present = node.get(key, _UNSET)
        if present is not _UNSET and present != value:
            raise ValueError(f"{old} ({value!r}) is deprecated and {new} ({present!r}) is set too: keep only {new}")
        node[key] = value
        warnings.warn(f"{old} is deprecated: use {new} ({old} is removed in {removed_in})", FutureWarning,
                      stacklevel=2)
    for old, (new, removed_in) in MOVED_KEYS.items():  # an `a.b.*` mapping emptied above, or empty, goes
        *parents, key = old.removesuffix(".*").split(".")
        section = _node(data, parents)
        if old.endswith(".*") and isinstance(section, dict) and section.get(key) == {}:
            del section[key]
            if old[:-2] not in moved_from:  # else its keys warned already
                warnings.warn(f"{old} is deprecated: use {new} ({old} is removed in {removed_in})", FutureWarning,
                              stacklevel=2)
    return data


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


class PaperConfig(Section):
    """`sao paper`: the paper's claims as experiments on the chain test-bed, with seeds (sao.paper)."""

    lr: float = Field(1e-3, gt=0, description="the policy learning rate of every arm (the critic's: 5x it), chosen "
                      "once by `sao paper --sweep`")
    lr_sweep: list[float] = Field([1e-3, 3e-3, 1e-2], min_length=1, description="`sao paper --sweep`: the "
                                  "learning rates tried on the SAO arm")
    sweep_seeds: int = Field(2, gt=0, description="`sao paper --sweep`: seeds per learning rate")
    sweep_steps: int = Field(30, gt=0, description="`sao paper --sweep`: policy steps per run")
    steps: int = Field(100, gt=0, description="policy steps per run")
    seeds: int = Field(3, gt=0, description="seeds per arm (run.seed 0, 1, ...)")
    c1_seeds: int = Field(5, gt=0, description="seeds per arm of C1 (stability)")
    pretrain_steps: int = Field(5, ge=0, description="value pretraining: critic-only updates before the first "
                                "policy step (trainer.critic_only_steps) of every arm with a critic but C3's "
                                "no-pretraining arm")
    quick_steps: int = Field(12, gt=0, description="--quick: policy steps per run")
    quick_seeds: int = Field(2, gt=0, description="--quick: seeds per arm, C1's too")
    quick_pretrain_steps: int = Field(2, ge=0, description="--quick: critic-only updates before the policy's")
    shifts: int = Field(2, gt=0, description="C8: preference shifts in a run, evenly spaced "
                        "(testbed.chain.shift_every = steps / (shifts + 1))")
    collapse_drop: float = Field(0.2, gt=0, description="C1: a run collapses at the first policy step whose "
                                 "10-step moving-average reward is this far below the best one before it")
    ev_first_steps: int = Field(5, gt=0, description="C3: value pretraining is judged by the explained variance "
                                "over the first this-many policy steps")
    parallel: int = Field(1, gt=0, description="runs at once (C7's arms always run alone: they compare wall "
                          "clocks)")
    claims: list[Literal["C1", "C2", "C3", "C4", "C5", "C6", "C7", "C8"]] = Field(
        ["C1", "C2", "C3", "C4", "C5", "C6", "C7", "C8"], min_length=1,
        description="the claims to run and decide (their arms only)")


class Config(HarnessConfig):
    """The run config: one section per area (the sections of harness and below from ``HarnessConfig``,
    then those of the layers above); ``sao config`` prints it."""

    trainer: TrainerConfig = TrainerConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    value_pretrain: ValuePretrainConfig = ValuePretrainConfig()
    sft: SFTConfig = SFTConfig()
    cluster: ClusterConfig = ClusterConfig()
    eval: EvalConfig = EvalConfig()
    learn: LearnConfig = LearnConfig()
    demo: DemoConfig = DemoConfig()
    paper: PaperConfig = PaperConfig()

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        """Old keys at their new places (MOVED_KEYS)."""
        return move_keys(data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _trainable_dtype(self) -> Config:
        """model.dtype is the trainer's compute dtype too, and the trainer has no loss scaler (precision.autocast)."""
        if self.model.dtype == "float16":
            raise ValueError(FLOAT16_UNSUPPORTED)
        return self

    @model_validator(mode="after")
    def _gpu_plan_fits(self) -> Config:
        """The trainer ranks and engine replicas fit the cluster.* nodes (trainer.gpu_plan; no nodes: no check)."""
        gpu_plan(self)
        return self


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Config from ``path`` (YAML) with ``key.sub=value`` overrides applied on top."""
    data, source = load_yaml(path, overrides)
    if path is not None and any(item.partition("=")[0].strip() == "engine.kind" for item in overrides):
        switch_engine_kind(data, load_yaml(path)[0], overrides)
    return validate(Config, data, source)


def switch_engine_kind(data: dict, file_data: dict, overrides) -> None:
    """An override that changes the file's ``engine.kind`` drops the file's engine keys the new kind does not take
    (they were the old kind's): ``--config vllm.yaml engine.kind=expert``. Keys set by overrides stay (checked)."""
    engine, before = data.get("engine"), file_data.get("engine")
    if not (isinstance(engine, dict) and isinstance(before, dict)) or engine.get("kind") not in registry.ENGINES \
            or engine.get("kind") == before.get("kind", DEFAULT_KIND):
        return
    fields = registry.ENGINES[engine["kind"]].config.model_fields
    set_keys = [item.partition("=")[0].strip() for item in overrides]
    for key in [k for k in before if k not in fields]:
        if not any(s == f"engine.{key}" or s.startswith(f"engine.{key}.") for s in set_keys):
            engine.pop(key, None)


def dump_config(cfg: Config) -> str:
    """The config as YAML, every key with its value."""
    return dump_yaml(cfg)


def config_keys(model: BaseModel, prefix: str = "") -> Iterator[tuple[str, Any, str]]:
    """``(dotted key, value, description)`` of every leaf key of ``model``, in declaration order."""
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        if isinstance(value, EngineBase):
            yield from engine_keys(value, f"{prefix}{name}.")
        elif isinstance(value, BaseModel):
            yield from config_keys(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", value, field.description or ""


def engine_keys(engine: EngineBase, prefix: str) -> Iterator[tuple[str, Any, str]]:
    """``config_keys`` of the engine section over every registered kind: the common keys (``kind`` listing the
    kinds), then the kinds' own, each described with the kinds that take it and valued as in ``engine`` where its
    kind takes it, else by the first such kind's default."""
    kinds: dict[str, list] = {}
    for spec in registry.ENGINES.values():
        for key in spec.config.model_fields:
            kinds.setdefault(key, []).append(spec)
    for key, specs in kinds.items():
        fields = specs[0].config.model_fields
        value = getattr(engine, key) if key in type(engine).model_fields else \
            fields[key].get_default(call_default_factory=True)
        if key == "kind":
            description = f"{EngineBase.model_fields[key].description}: " + "; ".join(
                f"{s.kind}: {s.summary}" for s in specs)
        elif key in EngineBase.model_fields:
            description = EngineBase.model_fields[key].description or ""
        else:
            description = f"(kind: {', '.join(s.kind for s in specs)}) {fields[key].description or ''}"
        yield f"{prefix}{key}", value, description


def _yaml_value(value: Any) -> str:
    """A default as it is written in a config file: ``local``, ``null``, ``true``, ``[]``, ``1e-06``."""
    value = str(value) if isinstance(value, Path) else value
    if isinstance(value, str) and value:
        return value
    return json.dumps(value)


def config_table(cfg: Config | None = None) -> str:
    """The markdown table ``| key | default | description |`` of every key (default: the built-in defaults), the
    engine's of every kind (``engine_keys``)."""
    rows = ["| key | default | description |", "|---|---|---|"]
    for key, value, description in config_keys(cfg if cfg is not None else Config()):
        rows.append(f"| `{key}` | `{_yaml_value(value)}` | {description.replace('|', chr(92) + '|')} |")
    return "\n".join(rows) + "\n"
