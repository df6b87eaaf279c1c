"""``engine.vllm_args``: any ``vllm.AsyncEngineArgs`` field, checked at config time without importing vLLM.

The fields are those of vLLM 0.29.0's ``AsyncEngineArgs`` dataclass (``vllm_engine_args.txt`` beside
this file, written from it; ``tests/vllm/test_vllm_config.py`` checks the list against the installed
vLLM, and where vLLM is importable the check reads the dataclass itself). The engine sets a few fields
itself and refuses them here: the ones with their own config key, and the ones the engine's contract
depends on (the model, processed logprobs, the worker extension).
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib.util
from functools import cache
from pathlib import Path

FIELDS_FILE = Path(__file__).with_name("vllm_engine_args.txt")
# fields with a config key of their own
OWN_KEYS = {"dtype": "model.dtype", "tensor_parallel_size": "engine.tensor_parallel_size",
            "gpu_memory_utilization": "engine.gpu_memory_utilization", "seed": "run.seed",
            "max_model_len": "engine.max_model_len", "model": "model.path",
            "kv_cache_memory_bytes": "engine.kv_cache_bytes"}
# fields the engine's contract needs as it sets them
FIXED = {"logprobs_mode": "processed logprobs are what the trainer recomputes",
         "worker_extension_cls": "the weight updates run in it",
         "tokenizer": "the proxy tokenizes with model.path's tokenizer"}


@cache
def engine_arg_fields() -> frozenset[str]:
    """``AsyncEngineArgs``' field names: the installed vLLM's where it imports cheaply, else vLLM 0.29.0's."""
    if importlib.util.find_spec("vllm") is not None:
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs  # lazy: optional, heavy

            return frozenset(f.name for f in dataclasses.fields(AsyncEngineArgs))
        except Exception:  # noqa: BLE001  (a broken vLLM install: fall back to the shipped list)
            pass
    return shipped_fields()


def shipped_fields() -> frozenset[str]:
    lines = FIELDS_FILE.read_text().splitlines()
    return frozenset(s.strip() for s in lines if s.strip() and not s.startswith("#"))


def check_vllm_args(args: dict) -> dict:
    """``args`` if every key is an ``AsyncEngineArgs`` field the engine leaves to the config; else ValueError."""
    fields = engine_arg_fields()
    for key in args:
        if not isinstance(key, str) or key not in fields:
            close = difflib.get_close_matches(key, sorted(fields), n=3) if isinstance(key, str) else []
            raise ValueError(f"engine.vllm_args: {key!r} is not a field of vllm.AsyncEngineArgs"
                             + (f" (close: {', '.join(close)})" if close else ""))
        if key in OWN_KEYS:
            raise ValueError(f"engine.vllm_args: set {key!r} with {OWN_KEYS[key]}, not here")
        if key in FIXED:
            raise ValueError(f"engine.vllm_args: {key!r} is set by the engine ({FIXED[key]})")
    return args
