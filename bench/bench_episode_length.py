"""Tokens per expert episode (agent.profile openhands vs compact) and the tiny policy's step time on each.

    .venv/bin/python bench/bench_episode_length.py                 # 4 bundled tasks, batch of 4
    .venv/bin/python bench/bench_episode_length.py --tasks 8 --threads 2 --repeats 3  # on idle cores

Runs expert episodes (``engine.kind: expert``: the gold patch as minimal edits, through the proxy, the
SDK, the sandbox and the grader) on bundled tasks with each profile and reports tokens per episode
(all of it, and action tokens). Then it times the tiny policy's forward + backward
(``trainer.modeling.models.policy_token_logprobs``, SDPA attention, the trainer's micro-batches) on a batch of
each profile's traces (the same batch size) and prints the ratio, both measured in this run. Needs
Docker and the bundled images (``.venv/bin/sao tasks build --task-repo tasks/bundled``).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from sao_harness.harness.rollout import run_rollout, start_policy  # noqa: E402  (after the environment above)
from sao_harness.harness.runner import load_tasks as run_tasks  # noqa: E402
from sao_harness.harness.store import TraceStore  # noqa: E402
from sao_harness.sao.config import load_config  # noqa: E402
from sao_harness.tasks.formats.loaders import load_tasks  # noqa: E402

PROFILES = ("openhands", "compact")


def expert_traces(profile: str, task_ids: list[str], root: Path) -> list:
    """One graded expert episode per task with ``profile``; the trajectories."""
    cfg = load_config(ROOT / "configs/local.yaml", [
        f"run.root={root}", f"run.name={profile}", "engine.kind=expert", f"agent.profile={profile}",
        f"tasks.instances=[{', '.join(task_ids)}]", "rollout.workers=2", "sampling.max_tokens=4096",
        f"model.cache_dir={ROOT / '.cache/sao'}"])
    tasks = run_tasks(cfg, "swe", log=lambda *_: None)  # as `sao rollout`: loaded and pre-flighted once
    engine, proxy = start_policy(cfg, tasks)
    try:
        run_rollout(cfg, tasks, engine=engine, proxy=proxy, log=lambda *_: None)
    finally:
        proxy.stop()
    return sorted(TraceStore(cfg.run.dir), key=lambda t: t.task_id)


def step_time(model, trajs, repeats: int, micro_batch_tokens: int) -> float:
    """Median seconds of one forward + backward of the policy's action logprobs over the batch ``trajs``,
    in the trainer's micro-batches (``trainer.algo.batch.micro_batches``)."""
    from sao_harness.trainer.algo.batch import build_batch, micro_batches
    from sao_harness.trainer.modeling.models import policy_token_logprobs

    b = build_batch(trajs)
    groups = micro_batches(b, micro_batch_tokens)
    times = []
    for i in range(repeats + 1):  # the first is a warm-up
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        for rows in groups:
            width = int(b.attention_mask[rows].sum(1).max())
            ids, am, act = (x[rows, :width] for x in (b.input_ids, b.attention_mask, b.action_mask))
            logp, _ = policy_token_logprobs(model, ids, am, act)
            (-logp.sum() / b.action_mask.sum()).backward()
        if i:
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=4, help="bundled tasks (= the batch size)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads for the step timing (more threads than idle cores is far slower)")
    ap.add_argument("--repeats", type=int, default=3, help="timed forward+backward passes per profile")
    args = ap.parse_args()
    task_ids = sorted(t.instance_id for t in load_tasks("bundled"))[:: max(1, 20 // args.tasks)][:args.tasks]
    traces = {}
    with tempfile.TemporaryDirectory(prefix="sao-bench-eplen-") as tmp:
        for profile in PROFILES:
            traces[profile] = expert_traces(profile, task_ids, Path(tmp))
    print(f"expert episodes on {len(task_ids)} bundled tasks (tiny tokenizer, native tool calls):")
    print(f"{'profile':<10} {'resolved':>8} {'tokens mean':>11} {'max':>6} {'first prompt':>12} {'actions':>8}")
    for profile, trajs in traces.items():
        n = [t.num_tokens for t in trajs]
        first = [len(t.segments[0]) for t in trajs]
        acts = [t.num_action_tokens for t in trajs]
        resolved = sum((t.reward or 0) > 0 for t in trajs)
        print(f"{profile:<10} {resolved:>5}/{len(trajs):<2} {sum(n) / len(n):>11.0f} {max(n):>6} "
              f"{sum(first) / len(first):>12.0f} {sum(acts) / len(acts):>8.0f}")

    import torch  # lazy: heavy
    import transformers
    from transformers import AutoModelForCausalLM

    from sao_harness.harness.tiny_model import ensure_tiny_model
    from sao_harness.trainer.config import TrainerConfig

    transformers.logging.set_verbosity_error()
    logging.getLogger("torch").setLevel(logging.WARNING)

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(ensure_tiny_model(ROOT / ".cache/sao", 0), attn_implementation="sdpa")
    model.train()
    mbt = TrainerConfig().max_tokens_per_microbatch
    secs = {p: step_time(model, traces[p], args.repeats, mbt) for p in PROFILES}
    for p in PROFILES:
        width = max(t.num_tokens for t in traces[p])
        print(f"forward+backward, batch of {len(traces[p])} (longest {width} tokens, micro-batches of <= {mbt} "
              f"padded tokens) ({p}): {secs[p]:.2f} s")
    print(f"step-time ratio openhands/compact: {secs['openhands'] / secs['compact']:.1f}x "
          f"({args.threads} threads, median of {args.repeats})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
