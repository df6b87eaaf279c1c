"""Typed, validated run configuration: YAML file + dotted overrides (``trainer.lr=1e-6``).

Every section is a pydantic model with ``extra="forbid"``, so an unknown key is an error that names
it. ``load_config`` raises ``ConfigError`` with a one-line message; the CLI prints it and exits 2.
Section models live next to the code that uses them (``envs.config``, ``trainer.config``, ...);
this module only assembles them.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from envs.config import DockerConfig, SandboxConfig
from eval.config import EvalConfig
from tasks.config import TasksConfig
from trainer.config import TrainerConfig, ValuePretrainConfig

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class ConfigError(ValueError):
    """A configuration problem, reported to the user as one line (exit code 2)."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunConfig(Section):
    name: str = "local"  # the run directory is <root>/<name>; reusing a name resumes the run
    root: Path = Path("runs")  # where run directories live
    seed: int = 0  # seeds sampling, task order and the trainer

    @property
    def dir(self) -> Path:
        return self.root / self.name


class ModelConfig(Section):
    # "tiny" builds the project's tiny Qwen3-MoE model into cache_dir; otherwise a local path or a
    # Hugging Face model id (loaded from the local Hugging Face cache / hub where reachable).
    path: str = "tiny"  # "tiny" (built locally), a local model directory, or a Hugging Face model id
    cache_dir: Path = Path(".cache/sao")  # where the tiny model is built (once per recipe)
    tiny_seed: int = 0  # the tiny model's weights and tokenizer are a function of this seed
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # weights' dtype in engine and trainer


class SamplingConfig(Section):
    temperature: float = Field(1.0, ge=0.0)  # rollout sampling temperature (0 = greedy)
    top_p: float = Field(1.0, gt=0.0, le=1.0)  # nucleus sampling (1 = off)
    top_k: int = Field(0, ge=0)  # top-k sampling (0 = off)
    max_tokens: int = Field(1024, gt=0)  # tokens per model turn


class EngineConfig(Section):
    kind: Literal["hf", "vllm", "scripted"] = "hf"  # hf: transformers on CPU; vllm: GPUs; scripted: test double
    device: str = "cpu"  # torch device of the hf engine
    max_batch: int = Field(8, gt=0)  # requests decoded together (hf)
    timeout_s: float = Field(600.0, gt=0)  # per engine call
    num_threads: int = Field(0, ge=0)  # hf: torch threads of the engine; 0 = automatic (1 for tiny models)
    # vllm only
    tensor_parallel_size: int = Field(1, gt=0)  # vllm: GPUs per engine
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1)  # vllm: fraction of GPU memory it may take
    max_model_len: int | None = Field(None, gt=0)  # vllm: context length (None: the model's)


class ProxyConfig(Section):
    host: str = "127.0.0.1"  # sao serve: loopback only
    port: int = Field(8000, ge=0, lt=65536)  # sao serve: port (0 = any free one)
    context_budget: int = Field(131_072, gt=0)  # tokens per episode; past it: finish_reason length, truncated_context
    tool_format: Literal["native", "prompt"] = "native"  # the agent's tool-call format (native tools / prompt text)
    full_history_check: bool = False  # compare every message every turn (catches in-place edits; O(history))


class AgentConfig(Section):
    max_iterations: int = Field(300, gt=0)  # LLM turns per episode, nudges included
    max_nudges: int = Field(10, ge=0)  # "please continue" replies to a turn without a tool call
    stuck_detection: bool = True  # the SDK's stuck detector, as the official runner keeps it
    no_change_timeout_s: int | None = None  # terminal "no new output" timeout; None = the SDK's 30 s
    model: str = "openai/sao-policy"  # litellm route to the proxy; the proxy ignores the name


class RolloutConfig(Section):
    workers: int = Field(2, gt=0)  # episodes run in parallel (rollout workers in train)
    max_retries: int = Field(2, ge=0)  # retries of an episode that ended in an infra error
    episodes_per_task: int = Field(1, gt=0)  # sao rollout: trajectories per task


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


def _parse_value(text: str) -> Any:
    """An override's value is YAML: ``1e-6`` -> float, ``true`` -> bool, ``[a, b]`` -> list."""
    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text


def apply_override(data: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    if any(k == "" for k in keys):
        raise ConfigError(f"override '{dotted}': empty key segment")
    node = data
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override '{dotted}': '{key}' is not a section")
        node = child
    node[keys[-1]] = value


def _format_error(err: ValidationError, source: str) -> str:
    first = err.errors()[0]
    loc = [str(p) for p in first["loc"]]
    if first["type"] == "extra_forbidden":
        value = first.get("input")
        while isinstance(value, dict) and len(value) == 1:  # name the whole dotted key: bogus.key
            (k, value), = value.items()
            loc.append(str(k))
        return f"{source}: unknown config key '{'.'.join(loc)}'"
    key = ".".join(loc)
    if not loc:  # a check across sections
        return f"{source}: {first['msg'].removeprefix('Value error, ')}"
    if first["type"] == "missing":
        return f"{source}: missing config key '{key}'"
    return f"{source}: config key '{key}': {first['msg']} (got {first.get('input')!r})"


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Config from ``path`` (YAML) with ``key.sub=value`` overrides applied on top."""
    data: dict = {}
    source = "defaults"
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            loaded = yaml.safe_load(p.read_text())
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: invalid YAML: {str(e).splitlines()[0]}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{p}: top level must be a mapping of sections")
        data = loaded or {}
        source = str(p)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form key.sub=value")
        key, _, raw = item.partition("=")
        apply_override(data, key.strip(), _parse_value(raw))
    if overrides:
        source += " + overrides"
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_error(e, source)) from None


def dump_config(cfg: Config) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
