"""Observation-skipping GAE: the vectorised implementation vs plain-Python loops.

    .venv/bin/python bench/bench_gae.py

64 trajectories x 32k tokens, multi-turn (observation segments of 50-3000 tokens, action segments of
10-800: ~20% action tokens, as in coding-agent traces), terminal reward on the last action token,
length-adaptive lambda per row, gamma = 1. Everything runs on one thread (torch included): the
Python loops use one core, and this machine's two cores are shared.

Two Python references, the same reverse loop over rows x tokens:
  - over the [B, T] tensors, element by element (`.item()` reads, indexed writes): the reference as
    written against the tensors the trainer holds; the target (>= 50x) is measured against it. It
    takes minutes on the whole batch, so it is timed on a subset of rows and extrapolated per token;
  - over Python lists (tensor -> list conversion not timed): the fastest pure-Python form, a
    stricter baseline; the whole batch is timed, and the speed-up against it is printed too.
Both are checked to give the vectorised numbers.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
from _common import verdict

from sao_harness.trainer.algo.gae import length_adaptive_lambda, skip_observation_gae

ROWS, LENGTH = 64, 32_768
TENSOR_LOOP_ROWS = 1  # rows timed for the element-by-element tensor loop (then extrapolated)


def python_gae(values, rewards, mask, gamma, lam):
    """Plain-Python reference for one row of Python lists: GAE over action tokens, observations skipped."""
    n = len(values)
    adv, ret = [0.0] * n, [0.0] * n
    next_value = next_adv = 0.0
    for t in range(n - 1, -1, -1):
        if mask[t]:
            delta = rewards[t] + gamma * next_value - values[t]
            next_adv = delta + gamma * lam * next_adv
            next_value = values[t]
            adv[t], ret[t] = next_adv, next_adv + values[t]
    return adv, ret


def python_gae_tensors(values, rewards, mask, gamma, lam, rows):
    """The same loop over [B, T] tensors, element by element, for the given rows."""
    adv, ret = torch.zeros_like(values), torch.zeros_like(values)
    for b in rows:
        next_value = next_adv = 0.0
        lam_b = lam[b].item()
        for t in range(values.shape[1] - 1, -1, -1):
            if mask[b, t].item():
                v = values[b, t].item()
                delta = rewards[b, t].item() + gamma * next_value - v
                next_adv = delta + gamma * lam_b * next_adv
                next_value = v
                adv[b, t], ret[b, t] = next_adv, next_adv + v
    return adv, ret


def make_batch(seed=0):
    rng = random.Random(seed)
    mask = torch.zeros(ROWS, LENGTH, dtype=torch.bool)
    rewards = torch.zeros(ROWS, LENGTH)
    for row in range(ROWS):
        pos = 0
        while True:
            obs, act = rng.randint(50, 3000), rng.randint(10, 800)
            if pos + obs + act > LENGTH:
                break
            mask[row, pos + obs:pos + obs + act] = True
            pos += obs + act
        last = int(mask[row].nonzero()[-1])
        rewards[row, last] = float(rng.random() < 0.3)
    values = torch.rand(ROWS, LENGTH)
    return values, rewards, mask


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    torch.set_num_threads(1)
    values, rewards, mask = make_batch()
    lam = length_adaptive_lambda(mask.sum(1))
    print(f"GAE over {ROWS} trajectories x {LENGTH} tokens ({int(mask.sum())} action tokens), one thread")

    skip_observation_gae(values, rewards, mask, 1.0, lam)  # warm-up
    times = []
    for _ in range(9):
        start = time.perf_counter()
        adv, ret = skip_observation_gae(values, rewards, mask, 1.0, lam)
        times.append(time.perf_counter() - start)
    vectorised = statistics.median(times)
    print(f"vectorised skip_observation_gae: {vectorised * 1e3:.1f} ms (median of 9)")

    rows = list(range(TENSOR_LOOP_ROWS))
    start = time.perf_counter()
    ref_adv, _ = python_gae_tensors(values, rewards, mask, 1.0, lam, rows)
    subset = time.perf_counter() - start
    tensor_loop = subset * ROWS / len(rows)
    error_tensor = (ref_adv[rows] - adv[rows]).abs().max().item()
    print(f"Python loop over the tensors: {subset:.2f} s on {len(rows)} row(s) of {LENGTH} tokens, "
          f"extrapolated per token to {ROWS} rows: {tensor_loop:.1f} s (extrapolated, not measured); "
          f"max |difference| {error_tensor:.1e}")

    rows_v, rows_r, rows_m = values.tolist(), rewards.tolist(), mask.tolist()
    start = time.perf_counter()
    ref = [python_gae(rows_v[r], rows_r[r], rows_m[r], 1.0, float(lam[r])) for r in range(ROWS)]
    list_loop = time.perf_counter() - start
    error_list = max(max(abs(a - b) for a, b in zip(adv[r].tolist(), ref[r][0])) for r in range(ROWS))
    print(f"Python loop over lists, all {ROWS} rows: {list_loop * 1e3:.0f} ms (measured); "
          f"max |difference| {error_list:.1e}")

    speedup = tensor_loop / vectorised
    print(f"vectorised GAE at {ROWS} x {LENGTH // 1024}k: {speedup:.0f}x faster than the Python loop over the "
          f"tensors (target >= 50x): {verdict(speedup >= 50)}")
    strict = list_loop / vectorised
    print(f"vectorised GAE at {ROWS} x {LENGTH // 1024}k: {strict:.1f}x faster than the Python loop over lists "
          f"(stricter baseline, same target >= 50x): {verdict(strict >= 50)}")
    print(f"vectorised GAE matches both references to 1e-4: "
          f"{verdict(max(error_tensor, error_list) < 1e-4)}")


if __name__ == "__main__":
    main()
