"""Padding removed by packing micro-batches, the ranks' token balance, and the step time packed vs padded.

    .venv/bin/python bench/bench_packing.py                  # lognormal lengths + the newest demo run's traces
    .venv/bin/python bench/bench_packing.py --traces runs/demo-20261202-004210 --threads 2 --repeats 5

1. Tokens of a realistic batch: B = 128 episode lengths ~ LogNormal(log 16k, 1) clipped to
   [2k, 128k]. Padded: the micro-batches packing replaced (rows shortest first, each micro-batch
   padded to its longest row, rows x longest <= the budget); packed: trainer.algo.batch.micro_batches
   (real tokens only). Padding removed = 1 - packed / padded. Ranks (8): the most-loaded rank's
   tokens over the mean, by trajectory count (the old contiguous split) and by tokens
   (trainer.dist.distributed.split).
2. Step time: forward + backward of the policy's action logprobs (trainer.modeling.models.policy_token_logprobs,
   with the trainer's CPU attention, trainer.modeling.models.use_packed_attention "sdpa_packed": SDPA per trajectory)
   on the tiny model (harness.tiny_model), packed vs padded micro-batches of the same budget,
   alternated in this process, median of --repeats. On the lognormal batch scaled down 64x
   (synthetic tokens, a CPU-sized run), and on a demo run's trajectories: every trace store under
   --traces (default: the newest runs/demo-*, which `make demo` writes), in batches of
   trainer.batch_size.
3. Attention of packed rows (trainer.attn_impl): sdpa_packed (SDPA per trajectory) vs flex (FlexAttention
   under a document block mask), the same packed micro-batches of the lognormal batch, alternated in this
   process, median of --repeats; forward + backward where flex has a backward (CUDA), else the forward only
   (torch 2.13: no FlexAttention backward on CPU, and its CPU path is the eager dense reference).
"""
from __future__ import annotations

import argparse
import logging
import math
import os
import random
import sys
import time
from pathlib import Path

from _common import ROOT

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402  (after the environment above)

from sao_harness.harness.trace import Segment, Trajectory  # noqa: E402
from sao_harness.trainer.algo.batch import TrajectoryBatch, build_batch, micro_batches, pack, pack_groups  # noqa: E402
from sao_harness.trainer.config import TrainerConfig  # noqa: E402
from sao_harness.trainer.dist.distributed import split  # noqa: E402
from sao_harness.trainer.modeling.models import policy_token_logprobs, use_packed_attention  # noqa: E402

SCALE = 64  # the timed lognormal batch: lengths / 64 (2k..128k -> 32..2k tokens), budget / 64


def lognormal_lengths(n: int, seed: int = 0, median: int = 16_384, sigma: float = 1.0,
                      low: int = 2_048, high: int = 131_072) -> list[int]:
    rng = random.Random(seed)
    return [min(high, max(low, int(rng.lognormvariate(math.log(median), sigma)))) for _ in range(n)]


def synthetic(lengths: list[int], vocab: int, seed: int = 0) -> list[Trajectory]:
    """One trajectory per length: turns of 4/5 observation, 1/5 action tokens, random token ids."""
    rng, out = random.Random(seed), []
    for i, n in enumerate(lengths):
        segments, left = [], n
        while left > 1:
            turn = min(left, max(2, rng.randint(n // 8, n // 3)))
            act = max(1, turn // 5)
            segments.append(Segment("observation", [rng.randrange(vocab) for _ in range(turn - act)]))
            segments.append(Segment("action", [rng.randrange(vocab) for _ in range(act)], [-1.0] * act, [0] * act))
            left -= turn
        out.append(Trajectory(task_id=f"t{i}", traj_id=f"s{i}", reward=1.0, segments=segments))
    return out


def padded_micro_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """The grouping packing replaced: rows shortest first, a group while rows x longest <= max_tokens."""
    groups, current, longest = [], [], 0
    for row in sorted(range(len(lengths)), key=lambda r: lengths[r]):
        if current and (len(current) + 1) * max(longest, lengths[row]) > max_tokens:
            groups.append(current)
            current, longest = [], 0
        current.append(row)
        longest = max(longest, lengths[row])
    return groups + [current] if current else groups


def token_counts(lengths: list[int], max_tokens: int) -> tuple[int, int, int, int]:
    """(padded tokens, padded micro-batches, packed tokens, packed micro-batches)."""
    padded = padded_micro_batches(lengths, max_tokens)
    return (sum(len(g) * max(lengths[r] for r in g) for g in padded), len(padded), sum(lengths),
            len(pack_groups(lengths, max_tokens)))


def rank_balance(trajs: list[Trajectory], world: int) -> tuple[float, float]:
    """Most-loaded rank's tokens / the mean: the contiguous count split, then the token split."""
    def worst(parts):
        loads = [sum(t.num_tokens for t in p) for p in parts]
        return max(loads) / (sum(loads) / world)
    by_count = [trajs[r * len(trajs) // world:(r + 1) * len(trajs) // world] for r in range(world)]
    return worst(by_count), worst(split(trajs, world))


def passes(model, batch: TrajectoryBatch, groups: list[list[int]], packed: bool, backward: bool = True) -> None:
    """Forward (+ backward) of the action logprobs over the batch, micro-batch by micro-batch."""
    model.zero_grad(set_to_none=True)
    for rows in groups:
        if packed:
            mb = pack(batch, rows)
            logp, _ = policy_token_logprobs(model, mb.input_ids, None, mb.action_mask, position_ids=mb.position_ids)
        else:
            mb = batch.select(rows)
            logp, _ = policy_token_logprobs(model, mb.input_ids, mb.attention_mask, mb.action_mask)
        if backward:
            (-logp.sum()).backward()


def step_times(model, trajs: list[Trajectory], max_tokens: int, repeats: int) -> tuple[float, float, int, int]:
    """Median seconds (padded, packed), alternated so both see the same machine load; and the tokens
    each one runs (padded, packed)."""
    batch = build_batch(trajs)
    lengths = batch.attention_mask.sum(1).tolist()
    padded, packed = padded_micro_batches(lengths, max_tokens), micro_batches(batch, max_tokens)
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(repeats + 1):  # the first round is a warm-up
        for is_packed, groups in ((False, padded), (True, packed)):
            t0 = time.perf_counter()
            passes(model, batch, groups, is_packed)
            if i:
                times[is_packed].append(time.perf_counter() - t0)
    median = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    padded_tokens = sum(len(g) * max(lengths[r] for r in g) for g in padded)
    return median[False], median[True], padded_tokens, sum(lengths)


def attention_times(model, trajs: list[Trajectory], max_tokens: int, repeats: int,
                    backward: bool) -> tuple[float, float]:
    """Median seconds of the packed passes on sdpa_packed, then flex (alternated), with or without backward."""
    batch = build_batch(trajs)
    groups = micro_batches(batch, max_tokens)
    times: dict[str, list[float]] = {"sdpa_packed": [], "flex": []}
    for i in range(repeats + 1):  # the first round is a warm-up (and flex's compile on CUDA)
        for impl in times:
            use_packed_attention(model, impl)
            t0 = time.perf_counter()
            with torch.set_grad_enabled(backward):
                passes(model, batch, groups, packed=True, backward=backward)
            if i:
                times[impl].append(time.perf_counter() - t0)
    return tuple(sorted(v)[len(v) // 2] for v in times.values())


def demo_stores(traces: str | None) -> list[Path]:
    """Every trace store under --traces, or under the newest runs/demo-* of the repository."""
    if traces is None:
        runs = sorted((ROOT / "runs").glob("demo-*"), key=lambda p: p.stat().st_mtime)
        if not runs:
            return []
        traces = runs[-1]
    root = Path(traces)
    return [root] if root.name == "traces" else sorted(p for p in root.rglob("traces") if p.is_dir())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", help="a demo run (or any run / traces directory); default: the newest runs/demo-*")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (more than idle cores is far slower)")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds (padded and packed each) per batch")
    args = ap.parse_args()

    import transformers  # lazy: heavy
    from transformers import AutoModelForCausalLM  # lazy: heavy

    from sao_harness.harness.store import TraceStore  # lazy: only the demo part reads traces
    from sao_harness.harness.tiny_model import ensure_tiny_model  # lazy: builds the model once

    transformers.logging.set_verbosity_error()
    logging.getLogger("torch").setLevel(logging.WARNING)
    torch.set_num_threads(args.threads)
    cfg = TrainerConfig()

    lengths = lognormal_lengths(128)
    print(f"1. a batch of {len(lengths)} episodes, lengths ~ LogNormal(log 16k, 1) clipped to [2k, 128k] "
          f"(median {sorted(lengths)[64]}, max {max(lengths)}, mean {sum(lengths) / len(lengths):.0f} tokens)")
    print(f"   one padded [B, T] batch: {len(lengths) * max(lengths):,} tokens")
    print(f"   {'budget':>8} {'padded tokens':>14} {'micro-b.':>8} {'packed tokens':>14} {'micro-b.':>8} "
          f"{'padding removed':>15}")
    for budget in (cfg.max_tokens_per_microbatch, 131_072):
        padded, n_padded, packed, n_packed = token_counts(lengths, budget)
        print(f"   {budget:>8} {padded:>14,} {n_padded:>8} {packed:>14,} {n_packed:>8} {1 - packed / padded:>14.1%}")
    world = 8
    count_worst, token_worst = rank_balance(synthetic(lengths, 2, seed=1), world)
    print(f"   {world} ranks, most-loaded rank's tokens / mean: {count_worst:.2f} split by trajectory count, "
          f"{token_worst:.3f} split by tokens (greedy)")

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(ensure_tiny_model(ROOT / ".cache/sao", 0), attn_implementation="sdpa")
    use_packed_attention(model, "sdpa_packed").train()
    vocab = model.config.vocab_size
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"\n2. tiny model ({params:.1f} M params, SDPA per trajectory), forward + backward of the action "
          f"logprobs, {args.threads} thread(s), median of {args.repeats}:")
    cases = [(f"lognormal / {SCALE}", synthetic([max(2, n // SCALE) for n in lengths], vocab),
              cfg.max_tokens_per_microbatch // SCALE)]
    stores = demo_stores(args.traces)
    for store in stores:
        trajs = [t for t in TraceStore(store) if t.reward is not None and not t.breaks and t.num_tokens
                 and max(t.token_ids) < vocab][:cfg.batch_size]
        if trajs:
            name = f"demo {store.parent.name} ({len(trajs)} trajectories)"
            cases.append((name, trajs, cfg.max_tokens_per_microbatch))
    if not stores:
        print("   (no demo run found: `make demo` writes one under runs/, or pass --traces)")
    print(f"   {'batch':<36} {'padded tokens':>13} {'packed tokens':>13} {'removed':>8} {'padded s':>9} "
          f"{'packed s':>9} {'packed/padded':>13}")
    for name, trajs, budget in cases:
        t_padded, t_packed, n_padded, n_packed = step_times(model, trajs, budget, args.repeats)
        print(f"   {name:<36} {n_padded:>13,} {n_packed:>13,} {1 - n_packed / n_padded:>8.1%} {t_padded:>9.2f} "
              f"{t_packed:>9.2f} {t_packed / t_padded:>13.2f}")

    name, trajs, budget = cases[0]
    backward = next(model.parameters()).is_cuda  # FlexAttention has no CPU backward
    t_sdpa, t_flex = attention_times(model, trajs, budget, args.repeats, backward)
    print(f"\n3. packed attention on the {name} batch, {'forward + backward' if backward else 'forward only'} "
          f"on {next(model.parameters()).device.type}, median of {args.repeats}: sdpa_packed {t_sdpa:.3f} s, "
          f"flex {t_flex:.3f} s, flex / sdpa_packed {t_flex / t_sdpa:.2f}")
    use_packed_attention(model, "sdpa_packed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
