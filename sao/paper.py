"""`make paper` / `sao paper`: the paper's claims as experiments on the long-horizon test-bed, with seeds.

``run_paper(cfg, quick, resume) -> int`` runs every arm of every claim (``CLAIMS``, ``ARMS``) as its own
``sao train`` process on one written config (``paper.yaml``: the chain test-bed, ``trainer.env: chain``,
SAO at the paper's settings) plus the arm's overrides, ``run.seed`` = the seed, and one learning rate for
every arm (``paper.lr``, the critic's 5x it, chosen once by ``sao paper --sweep``). Each run goes to
``<root>/runs/<arm>/s<seed>/`` and is done when its ``done.json`` is there: a killed ``sao paper``
continues with ``--resume <root>``, rerunning only the unfinished runs (the one that was cut off starts
over). Progress: one line per run (its reward first -> last, its wall time, runs left and the time they
should take).

Then ``sao.paper_claims`` decides every claim from the runs' metrics (``sao.paper_stats``: per-seed
figures, 95% intervals, reproduced / contradicted / inconclusive) and ``sao.paper_report`` writes
``paper.{md,html,json,png}``; the last lines printed are one per claim, then
``paper: N of 8 claims reproduced, K contradicted, J inconclusive (S seeds, T min)``.
``--quick`` runs the same experiments with ``paper.quick_steps`` and ``paper.quick_seeds`` and says
``(quick)`` in every line. Returns 0 when every run finished, 1 otherwise (the report still gets written,
its claims computed from what ran).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sao_harness.core.errors import UserError
from sao_harness.core.files import atomic_write_text
from sao_harness.sao.config import dump_config, load_config
from sao_harness.sao.paper_arms import ALONE, ARMS, C1_ARMS, CLAIMS, ONLINE
from sao_harness.sao.paper_claims import decide
from sao_harness.sao.paper_report import summary_line, write_report
from sao_harness.sao.paper_stats import REWARD, auc_reward, interval, series
from sao_harness.trainer.report.metrics import read_metrics


def arm_seeds(arm: str, seeds: int, c1_seeds: int) -> int:
    return c1_seeds if arm in C1_ARMS else seeds


@dataclass(frozen=True)
class Plan:
    """What one `sao paper` runs: steps and seeds, the online shift, and the runs (arm, seed) in order."""

    quick: bool
    steps: int
    seeds: int
    c1_seeds: int
    shift_every: int
    pretrain_steps: int
    claims: tuple[str, ...] = tuple(c.id for c in CLAIMS)

    def arms(self) -> list[str]:
        """The arms of the claims run, in ARMS order."""
        wanted = {arm for c in CLAIMS if c.id in self.claims for arm in c.arms}
        return [arm for arm in ARMS if arm in wanted]

    def runs(self) -> list[tuple[str, int]]:
        """Seed-major (every arm's seed 0, then seed 1, ...): an interrupted run has every arm at some seeds."""
        c1 = self.c1_seeds if "C1" in self.claims else self.seeds
        most = max(self.seeds, c1)
        return [(arm, s) for s in range(most) for arm in self.arms() if s < arm_seeds(arm, self.seeds, c1)]

    def to_dict(self) -> dict:
        return {"quick": self.quick, "steps": self.steps, "seeds": self.seeds, "c1_seeds": self.c1_seeds,
                "shift_every": self.shift_every, "pretrain_steps": self.pretrain_steps, "claims": list(self.claims)}


def make_plan(pc, quick: bool) -> Plan:
    """The plan of `paper` (a PaperConfig): the full run, or --quick's fewer steps and seeds."""
    steps = pc.quick_steps if quick else pc.steps
    seeds = pc.quick_seeds if quick else pc.seeds
    c1 = pc.quick_seeds if quick else pc.c1_seeds
    shifts = max(1, round(steps / (pc.shifts + 1)))  # paper.shifts shifts, evenly spaced
    pretrain = pc.quick_pretrain_steps if quick else pc.pretrain_steps
    return Plan(quick, steps, seeds, c1, shifts, pretrain, tuple(pc.claims))


def run_overrides(plan: Plan, arm: str, seed: int, lr: float, root: Path, label: str | None = None) -> list[str]:
    """The `sao train` overrides of one run (on top of paper.yaml), in `run_dir(root, label or arm, seed)`."""
    pretrain = 0 if "trainer.critic_only_steps=0" in ARMS[arm] else plan.pretrain_steps
    extra = [f"testbed.chain.shift_every={plan.shift_every}"] if arm in ONLINE else []
    return [f"run.root={root / 'runs' / (label or arm)}", f"run.name=s{seed}", f"run.seed={seed}",
            f"trainer.lr={lr:g}", f"trainer.critic_lr={5 * lr:g}", f"trainer.critic_only_steps={pretrain}",
            f"trainer.max_steps={plan.steps + pretrain}", *ARMS[arm], *extra]


def run_dir(root: Path, arm: str, seed: int) -> Path:
    return root / "runs" / arm / f"s{seed}"


def is_done(root: Path, arm: str, seed: int) -> bool:
    return (run_dir(root, arm, seed) / "done.json").is_file()


def load_runs(root: Path, plan: Plan) -> dict[str, list[list[dict]]]:
    """arm -> the metrics records of each finished seed."""
    out: dict[str, list[list[dict]]] = {arm: [] for arm in plan.arms()}
    for arm, seed in plan.runs():
        if is_done(root, arm, seed):
            out[arm].append(read_metrics(run_dir(root, arm, seed) / "metrics.jsonl"))
    return out


def torch_threads(alone: bool, parallel: int) -> int:
    """A run's torch threads (OMP_NUM_THREADS): the cores shared among the runs at once, all of them when it
    runs alone. Two runs of two threads each on 2 cores sampled half what two of one thread do (docs/results)."""
    return max(1, (os.cpu_count() or 1) // (1 if alone else parallel))


class Runner:
    """Runs `sao train` processes, `parallel` at a time (an arm of `alone` by itself), each logging to its
    train.log; one progress line per finished run."""

    def __init__(self, config: Path, root: Path, parallel: int, tag: str, log, alone: tuple[str, ...] = ()):
        self.config, self.root, self.parallel, self.tag, self.log = config, root, parallel, tag, log
        self.alone = alone
        self.failed: list[str] = []
        self.seconds: list[float] = []

    def _start(self, arm: str, seed: int, overrides: list[str]) -> tuple:
        d = run_dir(self.root, arm, seed)
        if d.exists():
            shutil.rmtree(d)  # cut off last time: starts over
        d.mkdir(parents=True)
        out = open(d / "train.log", "w")
        cmd = [sys.executable, "-m", "sao_harness.sao.cli", "train", "--config", str(self.config), *overrides]
        threads = str(torch_threads(arm in self.alone, self.parallel))
        (d / "command.txt").write_text(f"OMP_NUM_THREADS={threads} " + " ".join(["sao", *cmd[3:]]) + "\n")
        env = {**os.environ, "OMP_NUM_THREADS": threads}
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env), out, time.monotonic()

    def run(self, todo: list[tuple[str, int, list[str]]], total: int) -> None:
        running: dict[tuple[str, int], tuple] = {}
        done_before = total - len(todo)
        queue = list(todo)
        while queue or running:
            alone = any(a in self.alone for a, _ in running)
            while queue and len(running) < self.parallel and not alone:
                arm, seed, overrides = queue[0]
                if arm in self.alone and running:
                    break
                queue.pop(0)
                running[(arm, seed)] = self._start(arm, seed, overrides)
                alone = arm in self.alone
            time.sleep(0.5)
            for key, (proc, out, t0) in list(running.items()):
                if proc.poll() is None:
                    continue
                out.close()
                del running[key]
                self._finished(*key, proc.returncode, time.monotonic() - t0)
                done_before += 1
                left = total - done_before
                eta = (sum(self.seconds) / len(self.seconds)) * left / self.parallel if self.seconds else 0
                self.log(f"paper{self.tag}: [{done_before}/{total}] {self._summary(*key)}; "
                         f"{left} left (~{eta / 60:.0f} min)")

    def _finished(self, arm: str, seed: int, rc: int, seconds: float) -> None:
        d = run_dir(self.root, arm, seed)
        self.seconds.append(seconds)
        if rc != 0:
            self.failed.append(f"{arm} s{seed}")
            return
        atomic_write_text(d / "done.json", json.dumps({"arm": arm, "seed": seed, "seconds": seconds}) + "\n")

    def _summary(self, arm: str, seed: int) -> str:
        d = run_dir(self.root, arm, seed)
        if not is_done(self.root, arm, seed):
            tail = (d / "train.log").read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
            return f"{arm} seed {seed}: FAILED: {tail[0][:200]} (see {d / 'train.log'})"
        seconds = json.loads((d / "done.json").read_text())["seconds"]
        r = series(read_metrics(d / "metrics.jsonl"), REWARD)
        return (f"{arm} seed {seed}: reward {r[0]:.2f} -> {r[-1]:.2f} over {len(r)} steps ({seconds:.0f} s)"
                if r else f"{arm} seed {seed}: no policy step logged ({seconds:.0f} s)")


def paper_root(cfg, resume: str | None) -> Path:
    if resume is None:
        return Path(cfg.run.root) / f"paper-{time.strftime('%Y%m%d-%H%M%S')}"
    root = Path(resume)
    if not (root / "paper.yaml").is_file() or not (root / "plan.json").is_file():
        raise UserError(f"--resume {resume}: not a `sao paper` directory (no paper.yaml and plan.json in it)")
    return root


def run_paper(cfg, quick: bool = False, resume: str | None = None, log=print) -> int:
    t_start = time.monotonic()
    pc = cfg.paper
    root = paper_root(cfg, resume).resolve()
    if resume is None:
        root.mkdir(parents=True)
        plan = make_plan(pc, quick)
        atomic_write_text(root / "paper.yaml", dump_config(cfg))
        atomic_write_text(root / "plan.json", json.dumps({**plan.to_dict(), "lr": pc.lr}, indent=1) + "\n")
    else:
        saved = json.loads((root / "plan.json").read_text())
        lr = saved.pop("lr")
        plan = Plan(**{**saved, "claims": tuple(saved["claims"])})
        cfg = load_config(str(root / "paper.yaml"), [])
        pc = cfg.paper
        if lr != pc.lr:
            raise UserError(f"--resume {root}: plan.json's lr {lr} is not paper.yaml's {pc.lr}")
    tag = " (quick)" if plan.quick else ""
    runs = plan.runs()
    todo = [(arm, seed, run_overrides(plan, arm, seed, pc.lr, root)) for arm, seed in runs
            if not is_done(root, arm, seed)]
    log(f"paper{tag}: {root}\n  claims {', '.join(plan.claims)}: {len(plan.arms())} arms, {len(runs)} runs "
        f"({plan.seeds} seeds, {plan.c1_seeds} for C1), "
        f"{plan.steps} policy steps each, lr {pc.lr:g} (critic {5 * pc.lr:g}), {pc.parallel} at a time; "
        f"{len(runs) - len(todo)} done already\n  resume an interrupted run with: sao paper --resume {root}")
    runner = Runner(root / "paper.yaml", root, pc.parallel, tag, log, ALONE if "C7" in plan.claims else ())
    runner.run(todo, len(runs))
    minutes = (time.monotonic() - t_start) / 60
    previous = json.loads((root / "wall.json").read_text())["minutes"] if (root / "wall.json").is_file() else 0.0
    atomic_write_text(root / "wall.json", json.dumps({"minutes": previous + minutes}) + "\n")
    results = decide(load_runs(root, plan), plan, pc)
    write_report(root, results, load_runs(root, plan), plan, pc, previous + minutes, runner.failed)
    for r in results:
        log(r.line(tag))
    log(summary_line(results, plan, previous + minutes, tag))
    for path in ("paper.md", "paper.html", "paper.json", "paper.png"):
        log(f"  {root / path}")
    if runner.failed:
        log(f"paper{tag}: {len(runner.failed)} run(s) failed: {', '.join(runner.failed)} (their train.log says why)")
    return 1 if runner.failed else 0


def run_sweep(cfg, log=print) -> int:
    """`sao paper --sweep`: the SAO arm at each of paper.lr_sweep (paper.sweep_seeds seeds, paper.sweep_steps);
    prints each learning rate's mean reward over the run and the best one, and writes sweep.json."""
    pc = cfg.paper
    root = (Path(cfg.run.root) / f"paper-sweep-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    root.mkdir(parents=True)
    atomic_write_text(root / "paper.yaml", dump_config(cfg))
    plan = Plan(True, pc.sweep_steps, pc.sweep_seeds, pc.sweep_seeds, pc.sweep_steps, pc.quick_pretrain_steps)
    runner = Runner(root / "paper.yaml", root, pc.parallel, " sweep", log)
    log(f"paper sweep: {root}\n  the SAO arm at lr {', '.join(f'{lr:g}' for lr in pc.lr_sweep)} (critic 5x), "
        f"{pc.sweep_seeds} seeds, {pc.sweep_steps} policy steps each")
    todo = [(f"lr-{lr:g}", s, run_overrides(plan, "sao", s, lr, root, label=f"lr-{lr:g}"))
            for lr in pc.lr_sweep for s in range(pc.sweep_seeds)]
    runner.run(todo, len(todo))
    rows = []
    for lr in pc.lr_sweep:
        per_seed = [auc_reward(read_metrics(run_dir(root, f"lr-{lr:g}", s) / "metrics.jsonl"))
                    for s in range(pc.sweep_seeds) if is_done(root, f"lr-{lr:g}", s)]
        rows.append({"lr": lr, "auc_reward": interval(per_seed).mean, "seeds": per_seed})
    best = max(rows, key=lambda r: r["auc_reward"] if r["auc_reward"] == r["auc_reward"] else -1)
    atomic_write_text(root / "sweep.json", json.dumps({"plan": plan.to_dict(), "rows": rows, "best": best["lr"]},
                                                      indent=1) + "\n")
    for r in rows:
        log(f"paper sweep: lr {r['lr']:g}: mean reward {r['auc_reward']:.3f} over {len(r['seeds'])} seed(s)")
    log(f"paper sweep: best lr {best['lr']:g} (set paper.lr to it); {root / 'sweep.json'}")
    return 1 if runner.failed else 0

