"""Inference engines behind one protocol (``protocol.Engine``); ``make_engine(cfg)`` picks one.

``hf``: transformers on CPU (tests, demo). ``vllm``: vLLM on GPUs or CPU (imported only when selected).
``scripted``: a test double that replays given assistant replies. ``expert``: the tasks' gold patches
as minimal ``file_editor`` edits (SFT data; ``harness.engines.expert``).
"""
from __future__ import annotations

from harness.engines.protocol import Engine, EngineError, EngineTimeout, GenerateResult, SamplingParams
from harness.engines.scripted import ScriptedEngine
from harness.tiny_model import resolve_model_path

__all__ = ["Engine", "EngineError", "EngineTimeout", "GenerateResult", "SamplingParams", "make_engine",
           "sampling_from_config"]


def sampling_from_config(cfg, **overrides) -> SamplingParams:
    """``cfg.sampling`` as ``SamplingParams``; keyword overrides that are not None win."""
    s = cfg.sampling
    base = dict(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_tokens=s.max_tokens)
    base.update({k: v for k, v in overrides.items() if v is not None})
    return SamplingParams(**base)


def make_engine(cfg, **kwargs) -> Engine:
    """The engine named by ``cfg.engine.kind``; ``kwargs`` go to its constructor (e.g. ``replies=``)."""
    kind = cfg.engine.kind
    path = resolve_model_path(cfg.model)
    if kind == "hf":
        from harness.engines.hf import HFEngine  # lazy: imports torch

        return HFEngine(path, device=cfg.engine.device, dtype=cfg.model.dtype, max_batch=cfg.engine.max_batch,
                        timeout_s=cfg.engine.timeout_s, seed=cfg.run.seed,
                        num_threads=cfg.engine.num_threads or None, **kwargs)
    if kind == "vllm":
        from harness.engines.vllm import VLLMEngine  # lazy: vLLM is optional (GPU only)

        trainer = getattr(cfg, "trainer", None)
        if trainer is not None and "bucket_bytes" not in kwargs:
            kwargs["bucket_bytes"] = int(trainer.weight_bucket_mb * 2**20)
        return VLLMEngine(path, dtype=cfg.model.dtype, tensor_parallel_size=cfg.engine.tensor_parallel_size,
                          gpu_memory_utilization=cfg.engine.gpu_memory_utilization,
                          timeout_s=cfg.engine.timeout_s, seed=cfg.run.seed,
                          max_model_len=cfg.engine.max_model_len, vllm_args=cfg.engine.vllm_args,
                          kv_cache_bytes=cfg.engine.kv_cache_bytes, **kwargs)
    if kind == "scripted":
        return ScriptedEngine(path, timeout_s=cfg.engine.timeout_s, **kwargs)
    if kind == "expert":  # kwargs may give tasks= (default: cfg.tasks) and read_file= (default: the task images)
        # lazy: the expert engine reads task images through docker-py and loads tasks (datasets)
        from harness.engines.expert import ExpertEngine
        from harness.expert import image_file_reader
        from tasks.loaders import tasks_from_config

        if "tasks" not in kwargs:
            kwargs["tasks"] = tasks_from_config(cfg)[0]
        kwargs.setdefault("read_file", image_file_reader(cfg.docker))
        return ExpertEngine(path, timeout_s=cfg.engine.timeout_s, **kwargs)
    raise EngineError(f"unknown engine.kind {kind!r} (expected hf, vllm, scripted or expert)")
