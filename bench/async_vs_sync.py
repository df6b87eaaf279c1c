"""Async SAO vs the synchronous group baseline: the pipeline's throughput and idle time.

    .venv/bin/python bench/async_vs_sync.py [--workers 16] [--batch 16] [--steps-async 16] [--rounds-sync 5]

The same `sao train` loop, engine actor, rollout workers and trace store run twice, in
`trainer.mode=async` (SAO: single rollouts, a batch the moment B are done, weights published under
running episodes) and `trainer.mode=sync` (G = 8 rollouts per task, a group barrier, rollouts paused
during the update). The workload is long-tailed: episode lengths ~ LogNormal(median 30 turns,
sigma 1) clipped to [1, 300], through the simulated environment with time scaled down: each turn is
one engine call of `--gen-ms` (the stand-in `SleepEngine`: the figure measures the pipeline, not
the model) and one environment step of `--env-ms`. The update is a fixed `--update-s` sleep (plus
the real weight publication), so both modes pay the same trainer cost per step.

Reported over the steady state (from the end of the first step to the end of the run):
trajectories trained per minute, engine idle fraction (wall time with no request in flight) and
trainer idle fraction (wall time waiting for a batch), and async / sync throughput.
Targets: async >= 2x sync throughput; async engine idle < 10%.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, fixed_update, verdict

from sao_harness.sao.config import load_config


def steady_state(run_dir: Path) -> dict:
    """Throughput and idle fractions from the end of step 1 to the end of the run (metrics.jsonl)."""
    from sao_harness.trainer.report.metrics import read_metrics

    rec = read_metrics(run_dir)
    span = rec[-1]["time"] - rec[0]["time"]
    durations = [b["time"] - a["time"] for a, b in zip(rec, rec[1:])]
    trained = sum(r["rollout/trajectories"] for r in rec[1:])

    def weighted(key):
        return sum(r[key] * d for r, d in zip(rec[1:], durations)) / span
    return {"steps": len(rec), "trained": trained, "span_s": span, "per_min": trained / span * 60,
            "engine_idle": weighted("perf/engine_idle_frac"), "trainer_idle": weighted("perf/trainer_idle_frac"),
            "dropped_stale": rec[-1]["rollout/dropped_stale_total"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--batch", type=int, default=16, help="B, both modes (sync: B/8 tasks x G=8)")
    ap.add_argument("--steps-async", type=int, default=16)
    ap.add_argument("--rounds-sync", type=int, default=5)
    ap.add_argument("--gen-ms", type=float, default=25.0, help="engine time per turn")
    ap.add_argument("--env-ms", type=float, default=25.0, help="environment time per turn")
    ap.add_argument("--update-s", type=float, default=1.0, help="trainer time per step (fixed)")
    ap.add_argument("--max-staleness", type=int, default=8)
    args = ap.parse_args()

    import ray

    from sao_harness.trainer.run.loop import train
    from sao_harness.trainer.run.ray_utils import start_ray

    root = Path(tempfile.mkdtemp(prefix="sao-bench-"))
    common = [f"run.root={root}", f"model.cache_dir={ROOT / '.cache/sao'}", "trainer.env=simulated",
              f"testbed.simulated.engine_s={args.gen_ms / 1000}", f"testbed.simulated.env_sleep_s={args.env_ms / 1000}",
              "testbed.simulated.turns_median=30", "testbed.simulated.turns_sigma=1.0",
              "testbed.simulated.turns_max=300",
              f"rollout.workers={args.workers}", f"trainer.batch_size={args.batch}", "trainer.save_every=100000",
              f"trainer.max_staleness={args.max_staleness}", "runtime.poll_interval_s=0.05",
              "runtime.batch_timeout_s=300", "rollout.max_retries=0", "proxy.context_budget=1000000"]
    modes = {
        "async": common + ["run.name=async", "trainer.mode=async", f"trainer.max_steps={args.steps_async}"],
        "sync": common + ["run.name=sync", "trainer.mode=sync", "trainer.group_size=8", "trainer.advantage=grpo",
                          f"trainer.max_steps={args.rounds_sync}"],
    }
    print(f"workload: episode turns ~ LogNormal(median 30, sigma 1) in [1, 300]; turn = {args.gen_ms:g} ms engine + "
          f"{args.env_ms:g} ms environment; update {args.update_s:g} s; {args.workers} workers, batch {args.batch}")
    start_ray(None, log=print)
    results = {}
    try:
        for mode, overrides in modes.items():
            cfg = load_config(ROOT / "configs/local.yaml", overrides)
            t0 = time.monotonic()
            train(cfg, update_fn=fixed_update(args.update_s), log=lambda m: None)
            results[mode] = r = steady_state(cfg.run.dir)
            print(f"{mode:5s}: {r['trained']:.0f} trajectories trained in {r['span_s']:.1f} s of steady state "
                  f"({r['steps']} steps, {time.monotonic() - t0:.0f} s with start-up): {r['per_min']:.1f} traj/min | "
                  f"engine idle {r['engine_idle']:.1%} | trainer idle {r['trainer_idle']:.1%} | "
                  f"dropped stale {r['dropped_stale']:.0f}", flush=True)
    finally:
        ray.shutdown()
    ratio = results["async"]["per_min"] / results["sync"]["per_min"]
    ok_ratio, ok_idle = ratio >= 2.0, results["async"]["engine_idle"] < 0.10
    print(f"async / sync throughput: {ratio:.2f}x")
    print(f"[{verdict(ok_ratio)}] async throughput >= 2x sync ({ratio:.2f}x)")
    print(f"[{verdict(ok_idle)}] async engine idle < 10% ({results['async']['engine_idle']:.1%}); "
          f"sync engine idle {results['sync']['engine_idle']:.1%}")
    return 0 if ok_ratio and ok_idle else 1


if __name__ == "__main__":
    sys.exit(main())
