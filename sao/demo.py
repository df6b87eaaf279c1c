"""`make demo` / `sao demo`: an agent getting better, on both paths, in about 10 minutes on 2 cores.

``run_demo(cfg) -> int`` makes a fresh ``<run.root>/<run.name>-<time>/`` and runs, each stage as its own
``sao`` process (``sao.learn.Stages``: timed and printed) on one written config (``demo.yaml``):
1. ``toy/``: the learning test-bed, ``sao train`` on ``demo.toy_config`` for ``demo.toy_steps`` SAO
   steps: its reward (first 5 -> last 5 steps) and the critic's explained variance rise;
2. ``expert/``: ``sao rollout engine.kind=expert`` on ``demo.tasks`` -> resolved traces;
3. ``warm_start/``: ``sao sft`` on them (``demo.sft_steps`` TRL steps);
4. ``sao/``: ``sao train`` from the warm start for ``demo.sao_minutes`` (``trainer.max_minutes``);
5. ``eval/``: the base model, the warm start and the SAO checkpoint, ``demo.samples`` episodes per
   task at ``eval.temperature`` (1): resolved = the mean guarded verdict over (task, sample), infra
   failures left out and counted (``sao.learn.eval_resolved``);
6. ``demo.png`` (both paths' curves, the resolved bars) and ``demo.html`` (linking every report);
   the last line is ``demo: toy reward A -> B (EV C), resolved base D% -> sft E% -> sao F% (N episodes)``,
   N the episodes graded per policy (the smallest count, when infra failures made them differ).
Returns 0 when every stage ran, 1 otherwise (the summary names the failed stages).
"""
from __future__ import annotations

import time
from pathlib import Path

from sao_harness.sao.config import dump_config
from sao_harness.sao.demo_report import write_demo_report
from sao_harness.sao.learn import Stages, _list, _pct, eval_resolved, fresh_dir
from sao_harness.trainer.report.compare import summarize
from sao_harness.trainer.report.metrics import read_metrics

POLICIES = ("base", "sft", "sao")


def _num(x) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def headline(toy: dict, resolved: dict[str, dict]) -> str:
    """``demo: toy reward A -> B (EV C), resolved base D% -> sft E% -> sao F% (N episodes)``."""
    counts = [resolved[p]["graded"] for p in POLICIES if p in resolved]
    rates = " -> ".join(f"{p} {_pct(resolved.get(p, {}).get('rate'))}" for p in POLICIES)
    return (f"demo: toy reward {_num(toy.get('reward_first5'))} -> {_num(toy.get('reward_last5'))} "
            f"(EV {_num(toy.get('ev_last5'))}), resolved {rates} ({min(counts) if counts else 0} episodes)")


def toy_summary(run_dir: Path) -> dict:
    """``trainer.report.compare.summarize`` of the test-bed run ({} when it logged nothing)."""
    if not (run_dir / "metrics.jsonl").is_file():
        return {}
    return summarize("toy", read_metrics(run_dir))


def run_demo(cfg, log=print) -> int:
    t_start = time.monotonic()
    dc = cfg.demo
    toy_source = Path(dc.toy_config)
    if not toy_source.is_file():
        log(f"demo: demo.toy_config={dc.toy_config}: no such file (run from the repository root, or give a path)")
        return 2
    root = fresh_dir(cfg).resolve()
    root.mkdir(parents=True)
    conf = root / "demo.yaml"
    conf.write_text(dump_config(cfg))
    toy_conf = root / "toy.yaml"  # the test-bed's own config, as it was run
    toy_conf.write_text(toy_source.read_text())
    stages = Stages(conf, log, prefix="demo")
    warm = root / "warm_start"
    tasks = f"tasks.instances={_list(dc.tasks)}"
    log(f"demo: {root}\n  test-bed: {dc.toy_config}, {dc.toy_steps} SAO steps\n  real path: {len(dc.tasks)} "
        f"bundled task(s) ({', '.join(dc.tasks)}); SFT {dc.sft_steps} steps; SAO {dc.sao_minutes:g} min; eval "
        f"{dc.samples} sample(s) per task at T={cfg.eval.temperature:g}")

    def at(stage: str) -> list[str]:
        return [f"run.root={root}", f"run.name={stage}"]

    stages.run("test-bed: sao train", ["train", *at("toy"), f"trainer.max_steps={dc.toy_steps}"], config=toy_conf)
    ok = (stages.run("expert traces", ["rollout", *at("expert"), "engine.kind=expert", tasks,
                                       "rollout.episodes_per_task=1", "sampling.max_tokens=4096"])
          and stages.run("sft warm start", ["sft", *at("sft"), f"sft.traces=[{root / 'expert' / 'traces'}]",
                                            f"sft.out_dir={warm}", f"sft.max_steps={dc.sft_steps}"]))
    trained = ok and stages.run("sao train", ["train", *at("sao"), f"model.path={warm}", tasks,
                                              f"trainer.max_minutes={dc.sao_minutes:g}"])
    evals: dict[str, list[Path]] = {}
    policies = {"base": ("base", "null"), "sft": ("sft", str(warm)) if ok else None,
                "sao": ("sao", "latest") if trained else None}
    for policy, where in policies.items():
        if where is None:
            continue
        stage, checkpoint = where
        evals[policy] = []
        for i in range(dc.samples):
            name = f"{policy}-s{i}"
            stages.run(f"eval {policy} (sample {i + 1}/{dc.samples})",
                       ["eval", *at(stage), f"eval.name={name}", f"eval.checkpoint={checkpoint}",
                        f"eval.instances={_list(dc.tasks)}", f"run.seed={cfg.run.seed + 1000 + i}"])
            evals[policy].append(root / stage / "eval" / name)
    resolved = {p: eval_resolved(dirs, dc.tasks, [])["train"] for p, dirs in evals.items()}
    toy = toy_summary(root / "toy")
    wall = time.monotonic() - t_start
    line = headline(toy, resolved)
    files = write_demo_report(root, toy_dir=root / "toy", sao_dir=root / "sao", toy=toy, resolved=resolved,
                              evals=evals, stages=stages.status, seconds=stages.seconds, wall_s=wall,
                              headline=line)
    failed = [n for n, s in stages.status.items() if s != "ok"]
    log(f"\n=== demo: summary ({wall / 60:.1f} min of demo time, setup excluded) ===")
    for name, status in stages.status.items():
        log(f"  {name:<30} {status:<16} {stages.seconds[name]:6.0f} s")
    for policy, r in resolved.items():
        log(f"  {policy:<5} resolved {_pct(r['rate'])} ({r['resolved']}/{r['graded']} episodes, "
            f"{r['infra_failures']} infra failures)")
    log("report: " + ", ".join(str(f) for f in files))
    if failed:
        log(f"failed: {', '.join(failed)}")
    log(line)
    return 1 if failed else 0
