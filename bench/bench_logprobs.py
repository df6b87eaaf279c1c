"""Peak memory and time of chunked vs full-logits token logprobs, forward + backward, on CPU.

    .venv/bin/python bench/bench_logprobs.py               # T = 8k and 32k, vocabulary 32k, hidden 64
    .venv/bin/python bench/bench_logprobs.py --measure-all # also run the full case at 32k (~20 GiB)

Each case runs in its own subprocess (so one case's allocations cannot hide another's). The child
builds hidden [T, H] and the LM-head weight [V, H] (both requiring grad), records its resident set
size (RSS), runs logprobs + entropy forward and backward, and reports peak RSS minus that baseline
(peak from getrusage ru_maxrss, exact; a psutil sampler thread gives a cross-check). The "full"
baseline is the usual code: logits = h @ W^T for all T positions, log_softmax, gather.
The full case needs ~5 [T, V] fp32 tensors (20 GiB at 32k). On this shared machine it runs only when
that is at most half the available memory (with --measure-all: 90%); otherwise
its figures are extrapolated linearly in T from the largest measured full case (memory and time of
the full computation are linear in T: measured 4.00x from 8k to 32k), and the output says so.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time

from _common import verdict

VOCAB, HIDDEN, CHUNK = 32_768, 64, 1024
LENGTHS = (8_192, 32_768)


def child(mode: str, length: int) -> None:
    import psutil
    import torch

    from sao_harness.trainer.modeling.models import chunked_token_logprobs

    torch.manual_seed(0)
    hidden = (torch.randn(length, HIDDEN) * 0.1).requires_grad_()
    weight = torch.randn(VOCAB, HIDDEN).requires_grad_()
    targets = torch.randint(0, VOCAB, (length,))
    coef = torch.randn(length)
    # warm up kernels on a small slice so one-off allocations do not count as the computation's
    chunked_token_logprobs(hidden[:8], weight, targets[:8], chunk_size=CHUNK)[0].sum().backward()
    hidden.grad = weight.grad = None

    process = psutil.Process()
    baseline = process.memory_info().rss
    sampled = [baseline]
    done = threading.Event()

    def sample():
        while not done.is_set():
            sampled.append(process.memory_info().rss)
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    if mode == "chunked":
        logp, entropy = chunked_token_logprobs(hidden, weight, targets, chunk_size=CHUNK)
    else:
        logq = torch.log_softmax(hidden @ weight.T, dim=-1)
        logp = logq.gather(-1, targets[:, None]).squeeze(-1)
        entropy = -(logq.exp() * logq).sum(-1)
    ((coef * logp).sum() + entropy.sum()).backward()
    elapsed = time.perf_counter() - start
    done.set()
    sampler.join()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
    print(json.dumps({"mode": mode, "T": length, "seconds": elapsed, "peak_extra": peak - baseline,
                      "sampled_extra": max(sampled) - baseline}))


def run_case(mode: str, length: int) -> dict:
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", mode, str(length)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def main(measure_all: bool) -> None:
    import psutil

    print(f"token logprobs + entropy, forward + backward, fp32, vocab {VOCAB}, hidden {HIDDEN}, "
          f"chunk {CHUNK} positions, CPU threads per process: torch default")
    results: dict[tuple[str, int], dict] = {}
    extrapolated = set()
    for length in LENGTHS:
        results[("chunked", length)] = run_case("chunked", length)
        need = 5 * length * VOCAB * 4  # ~5 live [T, V] fp32 tensors in forward + backward
        budget = psutil.virtual_memory().available * (0.9 if measure_all else 0.5)
        if need <= budget:
            results[("full", length)] = run_case("full", length)
        else:
            measured = [(t, r) for (m, t), r in results.items() if m == "full"]
            if not measured:
                raise SystemExit(f"not enough free memory for even the full case at T={length}")
            t0, r0 = measured[-1]
            results[("full", length)] = {"seconds": r0["seconds"] * length / t0,
                                         "peak_extra": r0["peak_extra"] * length / t0,
                                         "sampled_extra": r0["sampled_extra"] * length / t0}
            extrapolated.add(length)
        for mode in ("full", "chunked"):
            r = results[(mode, length)]
            note = f"  (extrapolated from the measured full case: it needs ~{gib(need)}, over the memory budget)" \
                if mode == "full" and length in extrapolated else ""
            print(f"T={length:>6} {mode:>7}: {r['seconds']:7.2f} s  peak extra memory {gib(r['peak_extra'])} "
                  f"(sampled {gib(r['sampled_extra'])}){note}")

    t_short, t_long = LENGTHS
    full, chunked = results[("full", t_long)], results[("chunked", t_long)]
    ratio = full["peak_extra"] / chunked["peak_extra"]
    ok = ratio >= 5
    print(f"chunked peak memory at {t_long // 1024}k: {ratio:.1f}x lower than full (target >= 5x): "
          f"{verdict(ok)}")
    growth = chunked["peak_extra"] / results[("chunked", t_short)]["peak_extra"]
    print(f"chunked peak memory growth {t_short // 1024}k -> {t_long // 1024}k: {growth:.2f}x for "
          f"{t_long / t_short:.0f}x tokens (target <= linear, {t_long / t_short:.0f}x): "
          f"{verdict(growth <= 1.1 * t_long / t_short)}")
    full_growth = full["peak_extra"] / results[("full", t_short)]["peak_extra"]
    print(f"full peak memory growth {t_short // 1024}k -> {t_long // 1024}k: {full_growth:.2f}x"
          + (" (extrapolated)" if t_long in extrapolated else ""))
    print(f"chunked time at {t_long // 1024}k: {chunked['seconds'] / full['seconds']:.2f}x the full computation's "
          "(it recomputes logits in backward, but reuses two chunk buffers)"
          + (" (full time extrapolated)" if t_long in extrapolated else ""))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("MODE", "T"), help=argparse.SUPPRESS)
    parser.add_argument("--measure-all", action="store_true",
                        help="run the full case at every T if it fits in 90%% of the available memory")
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
    else:
        main(args.measure_all)
