"""`make learn` / `sao learn`: a policy getting better on the real path, SAO against GRPO+DIS and GRPO.

``run_learn(cfg) -> int`` makes a fresh directory ``<run.root>/<run.name>-<time>`` and runs, each stage
as its own ``sao`` process on one written config (``learn.yaml``), every episode through the proxy,
the OpenHands agent, a Docker sandbox and the guarded grader:
1. ``expert/``: ``sao rollout engine.kind=expert`` on ``learn.train_tasks`` -> resolved traces;
2. ``warm_start/``: ``sao sft`` on them (TRL) -> the warm start, a model directory;
3. ``sao-value/`` (when the sao arm runs): value pretraining, a stage of its own before the arms:
   ``learn.value_episodes`` warm-start episodes per training task, then ``sao value-pretrain``; timed
   and reported beside the arms (its cost is part of SAO's: the report's "before RL" column);
4. ``<arm>/``: for each of ``learn.arms``, ``sao train`` from the warm start for the same
   ``learn.minutes`` of RL wall time (``trainer.max_minutes``): ``sao`` = the trainer section as
   configured (its critic from step 3), ``grpo-dis`` / ``grpo`` = sync groups of ``trainer.group_size``,
   GRPO advantages, DIS / the PPO clip;
5. ``eval/<policy>/s<i>``: the warm start and each arm's last checkpoint, ``learn.samples`` times
   (``run.seed`` = i) on the training and the held-out tasks at ``eval.temperature``;
   resolved@1 = mean over (task, sample) of the guarded verdict; infra failures are left out and counted;
6. ``report/``: ``learn.{json,md,html,png}`` (``sao.learn_report``: with what the machine-dependent
   budgets gave here: SFT steps, value-pretraining episodes and steps, each arm's RL steps and
   trajectories); the last line printed is
   ``learn: sao A% -> B%, grpo+dis C% -> D%, grpo E% -> F% (resolved@1, T=1, training tasks)``.
Returns 0 when every stage ran, 1 otherwise (the report then names the failed stages).
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from sao_harness.eval.paths import JsonlLog
from sao_harness.sao.config import dump_config
from sao_harness.sao.learn_report import VALUE_DIR, VALUE_STAGES, write_report
from sao_harness.tasks.grading.grade_status import INFRA_FAILURES, GradeStatus

ARM_DIRS = {"sao": "sao", "grpo+dis": "grpo-dis", "grpo": "grpo"}
ARM_OVERRIDES = {
    "sao": [],
    "grpo+dis": ["trainer.mode=sync", "trainer.advantage=grpo", "trainer.policy_loss=dis"],
    "grpo": ["trainer.mode=sync", "trainer.advantage=grpo", "trainer.policy_loss=ppo"],
}
WARM = "warm start"


def _list(items: list[str]) -> str:
    return "[" + ",".join(items) + "]"


def fresh_dir(cfg) -> Path:
    """``<run.root>/<run.name>-<time>``: a new directory per `sao learn` / `sao demo` run."""
    return Path(cfg.run.root) / f"{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def eval_resolved(eval_dirs: list[Path], train: list[str], heldout: list[str]) -> dict:
    """resolved@1 over the grades of ``eval_dirs`` (one per sample): for the training and the held-out
    tasks, the mean guarded verdict over every graded (task, sample). A task without a verdict in a
    sample (an infra error, no prediction) or with an infra-failure grade is left out and counted."""
    out = {}
    for split, tasks in (("train", train), ("heldout", heldout)):
        verdicts, infra = [], 0
        for d in eval_dirs:
            grades = {rec["instance_id"]: rec for rec in JsonlLog(d / "grades.jsonl").read()}  # the last one wins
            for iid in tasks:
                rec = grades.get(iid)
                if rec is None or rec.get("status") == GradeStatus.INFRA_FAILURE:
                    infra += 1
                else:
                    verdicts.append(bool(rec.get("resolved_guarded")))
        out[split] = {"resolved": sum(verdicts), "graded": len(verdicts), INFRA_FAILURES: infra,
                      "rate": sum(verdicts) / len(verdicts) if verdicts else None}
    return out


def _pct(rate) -> str:
    return "n/a" if rate is None else f"{100 * rate:.0f}%"


def headline(results: dict, arms: list[str]) -> str:
    """The last line: each arm's training-task resolved@1, warm start -> after RL."""
    before = results.get(WARM, {}).get("train", {}).get("rate")
    parts = [f"{arm} {_pct(before)} -> {_pct(results.get(arm, {}).get('train', {}).get('rate'))}" for arm in arms]
    return f"learn: {', '.join(parts)} (resolved@1, T=1, training tasks)"


class Stages:
    """Runs ``sao`` stages as processes (on ``config``, or a stage's own); records each one's status and
    wall time. ``prefix`` names the command in the progress lines."""

    def __init__(self, config: Path, log, prefix: str = "learn"):
        self.config, self.log, self.prefix = config, log, prefix
        self.status: dict[str, str] = {}
        self.seconds: dict[str, float] = {}

    def run(self, name: str, args: list[str], config: Path | None = None) -> bool:
        cmd = [sys.executable, "-m", "sao_harness.sao.cli", args[0], "--config", str(config or self.config), *args[1:]]
        self.log(f"\n=== {self.prefix}: {name} ===\n$ sao {' '.join(cmd[3:])}")
        sys.stdout.flush()
        t0 = time.monotonic()
        rc = subprocess.run(cmd, check=False).returncode
        self.seconds[name] = time.monotonic() - t0
        self.status[name] = "ok" if rc == 0 else f"failed (exit {rc})"
        self.log(f"=== {self.prefix}: {name}: {self.status[name]} ({self.seconds[name]:.0f} s)")
        return rc == 0


def value_pretrain(stages: Stages, at, warm: Path, train_only: str, episodes: int) -> list[str] | None:
    """The sao arm's critic cold-start fix: ``episodes`` warm-start episodes per training task, then
    ``sao value-pretrain`` on their Monte-Carlo returns (in ``sao-value/``) -> the override that starts
    the arm's critic from it; [] with ``episodes`` = 0; None when a stage failed."""
    if episodes == 0:
        return []
    ok = (stages.run(VALUE_STAGES[0], ["rollout", *at(VALUE_DIR), f"model.path={warm}", train_only,
                                        f"rollout.episodes_per_task={episodes}"])
          and stages.run(VALUE_STAGES[1], ["value-pretrain", *at(VALUE_DIR), f"model.path={warm}"]))
    critic = stages.config.parent / VALUE_DIR / "value_pretrain" / "critic"
    return [f"trainer.value_pretrain_checkpoint={critic}"] if ok else None


def run_learn(cfg, log=print) -> int:
    t_start = time.monotonic()
    lc = cfg.learn
    root = fresh_dir(cfg).resolve()
    root.mkdir(parents=True)
    conf = root / "learn.yaml"
    conf.write_text(dump_config(cfg))
    warm = root / "warm_start"
    stages = Stages(conf, log)
    everything = lc.train_tasks + [t for t in lc.heldout_tasks if t not in lc.train_tasks]
    train_only = f"tasks.instances={_list(lc.train_tasks)}"
    log(f"learn: {root}\n  train {len(lc.train_tasks)} task(s): {', '.join(lc.train_tasks)}\n"
        f"  held out {len(lc.heldout_tasks)}: {', '.join(lc.heldout_tasks)}\n  arms {', '.join(lc.arms)}, "
        f"{lc.minutes:g} min each; eval {lc.samples} sample(s) per task at T={cfg.eval.temperature:g}")

    def at(stage: str) -> list[str]:
        return [f"run.root={root}", f"run.name={stage}"]

    def evaluate(policy: str, stage: str, checkpoint: str) -> list[Path]:
        dirs = []
        for i in range(lc.samples):
            name = f"{ARM_DIRS.get(policy, 'warm')}-s{i}"
            stages.run(f"eval {policy} (sample {i + 1}/{lc.samples})",
                       ["eval", *at(stage), f"eval.name={name}", f"eval.checkpoint={checkpoint}",
                        f"eval.instances={_list(everything)}", f"run.seed={cfg.run.seed + 1000 + i}"])
            dirs.append(root / stage / "eval" / name)
        return dirs

    results: dict[str, dict] = {}
    evals: dict[str, list[Path]] = {}
    ok = (stages.run("expert traces", ["rollout", *at("expert"), "engine.kind=expert", train_only,
                                       "rollout.episodes_per_task=1", "sampling.max_tokens=4096"])
          and stages.run("sft warm start", ["sft", *at("sft"), f"sft.traces=[{root / 'expert' / 'traces'}]",
                                            f"sft.out_dir={warm}"]))
    if ok:
        evals[WARM] = evaluate(WARM, "sft", str(warm))
        critic = value_pretrain(stages, at, warm, train_only, lc.value_episodes) if "sao" in lc.arms else []
        for arm in lc.arms:
            stage = ARM_DIRS[arm]
            if arm == "sao" and critic is None:
                continue  # its value pretraining failed: the report names the stage
            trained = stages.run(f"train {arm}", ["train", *at(stage), f"model.path={warm}", train_only,
                                                  f"trainer.max_minutes={lc.minutes:g}",  # every arm: the same RL time
                                                  *(critic if arm == "sao" else []), *ARM_OVERRIDES[arm]])
            if trained:
                evals[arm] = evaluate(arm, stage, "latest")
    for policy, dirs in evals.items():
        results[policy] = eval_resolved(dirs, lc.train_tasks, lc.heldout_tasks)
    wall = time.monotonic() - t_start
    line = headline(results, lc.arms)
    files = write_report(root / "report", cfg=cfg, root=root, results=results, arms=lc.arms,
                         arm_dirs={a: root / ARM_DIRS[a] for a in lc.arms}, stages=stages.status,
                         seconds=stages.seconds, wall_s=wall, headline=line)
    failed = [n for n, s in stages.status.items() if s != "ok"]
    log(f"\n=== learn: summary ({wall / 60:.1f} min) ===")
    for name, status in stages.status.items():
        log(f"  {name:<34} {status:<16} {stages.seconds[name]:6.0f} s")
    for policy, r in results.items():
        log(f"  {policy:<10} resolved@1 train {_pct(r['train']['rate'])} ({r['train']['resolved']}/"
            f"{r['train']['graded']}), held-out {_pct(r['heldout']['rate'])} ({r['heldout']['resolved']}/"
            f"{r['heldout']['graded']})")
    log("report: " + ", ".join(str(f) for f in files))
    if failed:
        log(f"failed: {', '.join(failed)}")
    log(line)
    return 1 if failed else 0
