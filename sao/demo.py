"""`make demo` / `sao demo`: the main job on the embedded default, one command on a fresh machine.

``run_demo(cfg) -> int`` runs, each as its own ``sao`` process on one effective config written to
``<run.dir>/demo.yaml`` (so every stage sees the same overrides):
1. ``sao rollout`` (``make rollout-swe``): episodes of the tiny model on a few bundled tasks -> traces;
2. ``sao train``: SAO training -> checkpoints, metrics (then ``sao runs plot`` -> curves);
3. ``sao eval``: the base model and, when training wrote one, the newest checkpoint, on the same
   tasks -> predictions, swebench's summary, the report; then ``sao eval compare`` of the two.
What is missing (images, base image, tiny model) is built by the stages themselves. A stage that
fails is reported and the others still run. Returns 0 when every stage ran, 1 when one failed. Ends
with where the traces, checkpoints, curves and report are.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from sao.config import dump_config

# one task per bundled repository, mixed difficulty: the demo's wall time stays in minutes on 2 cores
DEMO_INSTANCES = ["sao-harness__minicfg-11", "sao-harness__semverkit-31", "sao-harness__spanlib-24",
                  "sao-harness__tablefmt-9"]


def demo_config(cfg):
    """``cfg`` with the demo's task subset where the config names none (bundled tasks only)."""
    cfg = cfg.model_copy(deep=True)
    if cfg.tasks.source == "bundled" and not cfg.tasks.instances:
        cfg.tasks.instances = list(DEMO_INSTANCES)
    if cfg.eval.dataset == "bundled" and not cfg.eval.instances:
        cfg.eval.instances = list(cfg.tasks.instances or DEMO_INSTANCES) if cfg.tasks.source == "bundled" \
            else list(DEMO_INSTANCES)
    return cfg


def _sao(args: list[str], log) -> int:
    cmd = [sys.executable, "-m", "sao.cli", *args]
    log(f"$ sao {' '.join(args)}")
    sys.stdout.flush()
    return subprocess.run(cmd, check=False).returncode


def newest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint ``eval.checkpoint=latest`` evaluates, or None when training wrote none."""
    from trainer.checkpoint import (  # lazy: trainer.checkpoint imports torch
        POLICY_CONFIG,
        resolve_checkpoint,
    )

    return resolve_checkpoint("latest", run_dir, need=POLICY_CONFIG)


def run_demo(cfg, log=print) -> int:
    t_start = time.monotonic()
    cfg = demo_config(cfg)
    run_dir = Path(cfg.run.dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    conf = (run_dir / "demo.yaml").resolve()
    conf.write_text(dump_config(cfg))
    base = ["--config", str(conf)]
    stages: dict[str, str] = {}  # stage -> ok | failed (exit N)
    times: dict[str, float] = {}

    def stage(name: str, args: list[str]) -> int:
        log(f"\n=== demo: {name} ===")
        t0 = time.monotonic()
        rc = _sao(args, log)
        times[name] = time.monotonic() - t0
        stages[name] = "ok" if rc == 0 else f"failed (exit {rc})"
        log(f"=== demo: {name}: {stages[name]} ({times[name]:.0f} s)")
        return rc

    log(f"demo: run {run_dir}, tasks {', '.join(cfg.tasks.instances or ['all'])}, config {conf}")
    stage("rollout-swe", ["rollout", *base])
    stage("train", ["train", *base])
    if stages["train"] == "ok":
        stage("curves", ["runs", "plot", str(run_dir)])
    base_name = "base"
    stage("eval (base model)", ["eval", *base, f"eval.name={base_name}", "eval.checkpoint=null"])
    trained = newest_checkpoint(run_dir)
    evals = [run_dir / "eval" / base_name]
    if trained:
        stage("eval (trained checkpoint)", ["eval", *base, "eval.name=trained", "eval.checkpoint=latest"])
        evals.append(run_dir / "eval" / "trained")
        if all((e / "report.json").is_file() for e in evals):
            stage("compare", ["eval", "compare", str(evals[0]), str(evals[1])])

    log(f"\n=== demo: summary ({time.monotonic() - t_start:.0f} s) ===")
    for name, status in stages.items():
        log(f"  {name:<26} {status:<16} {times[name]:6.0f} s")
    traces = run_dir / "traces"
    n_shards = len(list(traces.glob("shard-*.parquet"))) if traces.is_dir() else 0
    log(f"traces:      {traces} ({n_shards} shard(s); `sao trace list {traces}`)")
    if trained:
        log(f"checkpoints: {run_dir / 'checkpoints'} (newest: {trained.name})")
    else:
        log(f"checkpoints: none in {run_dir / 'checkpoints'} (train stage: {stages.get('train')})")
    curves = [p for p in (run_dir / "plots", run_dir / "metrics.jsonl", run_dir / "tb") if p.exists()]
    log("curves:      " + (", ".join(map(str, curves)) if curves else f"none (train stage: {stages.get('train')})"))
    for e in evals:
        if (e / "report.html").is_file():
            log(f"report:      {e / 'report.html'} (also report.md, report.json, predictions.jsonl)")
    failed = [n for n, s in stages.items() if s.startswith("failed")]
    if failed:
        log(f"failed: {', '.join(failed)}")
    return 1 if failed else 0
