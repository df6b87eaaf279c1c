"""The engine registry: ``engine.kind`` -> ``EngineSpec``, the one place an engine says what it is.

A spec names the engine's class (or ``"module:Class"``, imported only by ``make_engine``, so that
registering vLLM does not import it) and what the rest of the project asks of an engine kind:
its config model (the ``engine`` section of its kind: ``harness.engines.config``), the devices it runs
on, the weight-sync transports it takes (``runtime.weight_sync``; the first is ``auto``'s), the tool
parsers its replies can be read by, the GPUs a replica reserves. Its class builds it:
``cls.from_config(cfg, **kwargs)``. ``engine.kind`` is checked against ``ENGINES``.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import get_args

DEVICES = ("cpu", "cuda")
TRANSPORTS = ("object_store", "collective")  # the weight-sync transports (runtime.weight_sync besides auto)


@dataclass(frozen=True)
class EngineSpec:
    """``engine.kind: <kind>``: its class and its capabilities."""

    kind: str
    engine: type | str  # the Engine class, or "module:Class"; built by its from_config(cfg, **kwargs)
    summary: str  # one line for the docs (engine.kind's description)
    config: type  # its engine section: a harness.engines.config.EngineBase with kind: Literal[kind] and its keys
    devices: tuple[str, ...] = ("cpu",)  # where it runs
    weight_syncs: tuple[str, ...] = TRANSPORTS  # transports it takes; the first is weight_sync=auto's
    collective_on_gpu: bool = False  # takes a collective broadcast over NCCL into its GPUs (trainer on cuda)
    gpus_key: str | None = None  # the engine.* key of a replica's GPUs when engine.gpus_per_replica is null
    gpu_kv_cache: bool = False  # weights + KV cache in engine.gpu_memory_utilization of each GPU (the GPU plan)
    weight_buckets: bool = False  # from_config takes bucket_bytes= (sao train: runtime.weight_bucket_mb)
    needs_vllm: bool = False  # imports vLLM: runs with engine.vllm_python (vllm_env), `sao doctor` checks it
    tool_parsers: tuple[str, ...] | None = None  # the proxy.tool_parser values its replies fit; None: any

    def engine_class(self) -> type:
        """The class (``"module:Class"`` imported now)."""
        if not isinstance(self.engine, str):
            return self.engine
        module, _, name = self.engine.partition(":")
        return getattr(importlib.import_module(module), name)


ENGINES: dict[str, EngineSpec] = {}


def register_engine(spec: EngineSpec) -> EngineSpec:
    """Add ``spec`` under ``spec.kind``; a kind registered already, an unknown device or transport, or a config
    model whose ``kind`` is not ``Literal[spec.kind]`` or that lacks a key the spec names (``gpus_key``;
    ``gpu_memory_utilization`` for ``gpu_kv_cache``), is an error."""
    if spec.kind in ENGINES:
        raise ValueError(f"engine kind {spec.kind!r} is registered already ({ENGINES[spec.kind].engine})")
    bad = [d for d in spec.devices if d not in DEVICES] + [t for t in spec.weight_syncs if t not in TRANSPORTS]
    if bad or not spec.weight_syncs:
        raise ValueError(f"engine kind {spec.kind!r}: devices must be among {DEVICES} and weight_syncs a non-empty "
                         f"subset of {TRANSPORTS} (got devices={spec.devices}, weight_syncs={spec.weight_syncs})")
    keys = [spec.gpus_key] * bool(spec.gpus_key) + ["gpu_memory_utilization"] * spec.gpu_kv_cache
    fields = spec.config.model_fields
    if get_args(fields["kind"].annotation) != (spec.kind,) or any(k not in fields for k in keys):
        raise ValueError(f"engine kind {spec.kind!r}: its config model {spec.config.__name__} must declare "
                         f"kind: Literal[{spec.kind!r}]" + "".join(f", {k}" for k in keys))
    ENGINES[spec.kind] = spec
    return spec


def engine_spec(kind: str) -> EngineSpec:
    """The spec of ``kind``; ValueError listing the known kinds for any other."""
    try:
        return ENGINES[kind]
    except (KeyError, TypeError):
        raise ValueError(f"unknown engine.kind {kind!r} (known: {', '.join(sorted(ENGINES))})") from None


def replica_gpus(engine_cfg) -> float:
    """GPUs Ray reserves per replica: ``engine.gpus_per_replica``, else the spec's ``gpus_key`` value, else 0."""
    if engine_cfg.gpus_per_replica is not None:
        return engine_cfg.gpus_per_replica
    key = engine_spec(engine_cfg.kind).gpus_key
    return getattr(engine_cfg, key) if key else 0


def weight_sync_transport(kind: str, requested: str) -> str:
    """The weight-sync transport (``runtime.weight_sync``) for engine ``kind``: ``auto`` = the spec's first; one the
    engine does not take is a ValueError."""
    spec = engine_spec(kind)
    transport = spec.weight_syncs[0] if requested == "auto" else requested
    if transport not in spec.weight_syncs:
        raise ValueError(f"weight_sync={transport}: engine.kind={kind} takes {' or '.join(spec.weight_syncs)}")
    return transport
