"""Scale-out: pipeline throughput over 1, 2, 4 engine replicas, and weight publish time per transport.

    .venv/bin/python bench/scale_out.py [--replicas 1,2,4] [--workers-per-replica 4] [--publish-mb 256]

1. Throughput: the same `sao train` loop (async) on the simulated environment, with the stand-in
   `SleepEngine` (`testbed.simulated.engine_s`: each turn sleeps, no model: the pipeline is measured, the
   feed's routing, the proxies, the workers, the trace store and the trainer, not the model), at N
   replicas x a fixed number of workers per replica, and a fixed short update. Reported over the
   steady state (end of step 1 to the end of the run): trajectories per minute, and the ratio to
   the 1-replica figure. Target: >= 0.8 N.
2. Publish: a synthetic state dict of `--publish-mb` MB (fp32) published to `--publish-replicas`
   replicas by each transport of `runtime.weight_sync` (object store; gloo collective), best of
   `--repeats`: seconds per GB and the object-store / collective ratio.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, fixed_update, verdict

from sao_harness.sao.config import load_config


def throughput(root: Path, replicas: int, args) -> float:
    """Trajectories trained per minute in the steady state of one run."""
    from sao_harness.trainer.run.loop import train

    workers = replicas * args.workers_per_replica
    batch = max(4, workers // 2)
    cfg = load_config(ROOT / "configs/local.yaml", [
        f"run.root={root}", f"run.name=replicas-{replicas}", f"model.cache_dir={ROOT / '.cache/sao'}",
        "trainer.env=simulated", f"testbed.simulated.engine_s={args.gen_ms / 1000}",
        f"testbed.simulated.env_sleep_s={args.env_ms / 1000}", "testbed.simulated.turns_median=6",
        "testbed.simulated.turns_sigma=0.5", "testbed.simulated.turns_max=30", f"engine.replicas={replicas}",
        f"rollout.workers={workers}",
        f"trainer.batch_size={batch}", f"trainer.max_steps={args.steps}", "trainer.max_staleness=1000",
        "trainer.save_every=100000", "runtime.poll_interval_s=0.05", "runtime.batch_timeout_s=300",
        "rollout.max_retries=0", "runtime.weight_sync=object_store"])
    summary = train(cfg, update_fn=fixed_update(args.update_s), log=lambda m: None)
    ends = [end for _, end in summary["update_intervals"]]
    return batch * (len(ends) - 1) / (ends[-1] - ends[0]) * 60


def publish_s_per_gb(transport: str, args) -> float:
    """Best seconds per GB of `args.repeats` publishes of a synthetic state dict to the replicas."""
    import ray
    import torch

    from sao_harness.trainer.run.actors import EngineActor
    from sao_harness.trainer.run.loop import _resolved
    from sao_harness.trainer.run.weight_sync import make_weight_sync

    cfg = _resolved(load_config(ROOT / "configs/local.yaml", [
        f"model.cache_dir={ROOT / '.cache/sao'}", "trainer.env=simulated", "testbed.simulated.engine_s=0.01",
        f"runtime.weight_sync={transport}", "runtime.publish_timeout_s=600"]))
    n = args.publish_mb * 2**20 // 4 // 16
    weights = {f"layer{i}.weight": torch.randn(n) for i in range(16)}
    gb = sum(t.numel() * 4 for t in weights.values()) / 2**30
    actors = {f"r{i}": EngineActor.options(max_concurrency=4).remote(cfg, 0) for i in range(args.publish_replicas)}
    ray.get([a.info.remote() for a in actors.values()])
    sync = make_weight_sync(cfg.runtime, cfg.engine.kind, log=lambda m: None)
    try:
        sync.connect(actors)
        best = float("inf")
        for v in range(1, args.repeats + 1):
            t0 = time.monotonic()
            sync.publish(actors, v, weights, 600)
            best = min(best, time.monotonic() - t0)
        return best / gb
    finally:
        sync.close()
        for a in actors.values():
            ray.kill(a)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", default="1,2,4")
    ap.add_argument("--workers-per-replica", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--gen-ms", type=float, default=100.0, help="engine time per turn (SleepEngine)")
    ap.add_argument("--env-ms", type=float, default=100.0, help="environment time per turn")
    ap.add_argument("--update-s", type=float, default=0.2, help="trainer time per step (fixed)")
    ap.add_argument("--publish-mb", type=int, default=256)
    ap.add_argument("--publish-replicas", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-throughput", action="store_true")
    args = ap.parse_args()

    import ray

    from sao_harness.trainer.run.ray_utils import start_ray

    root = Path(tempfile.mkdtemp(prefix="sao-bench-scale-"))
    start_ray(None, log=print)
    ok = True
    try:
        if not args.skip_throughput:
            per_min = {}
            for n in [int(x) for x in args.replicas.split(",")]:
                per_min[n] = throughput(root, n, args)
                print(f"{n} replica(s) x {args.workers_per_replica} workers: {per_min[n]:.1f} traj/min", flush=True)
            base = per_min[min(per_min)]
            for n, v in per_min.items():
                ratio = v / base
                good = ratio >= 0.8 * n / min(per_min)
                ok &= good
                print(f"[{verdict(good)}] {n} replica(s): {ratio:.2f}x the 1-replica throughput "
                      f"(target >= {0.8 * n / min(per_min):.1f}x)")
        s_gb = {t: publish_s_per_gb(t, args) for t in ("object_store", "collective")}
        for t, v in s_gb.items():
            print(f"publish {args.publish_mb} MB to {args.publish_replicas} replicas, {t}: {v:.2f} s/GB", flush=True)
        print(f"publish time object_store / collective (gloo): {s_gb['object_store'] / s_gb['collective']:.2f}x")
    finally:
        ray.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
