"""The report of `sao learn`: ``learn.json``, ``learn.md``, ``learn.png`` and ``learn.html``.

Table: per policy (warm start, then each RL arm) resolved@1 on the training and the held-out tasks
(resolved / graded), and for the arms what ran before their RL (the sao arm's value pretraining: its
wall time, episodes and steps; a cost of SAO's, outside the equal RL time), their steps, trajectories
and the training episodes' reward first5 -> last5 (``trainer.report.compare.summarize``). ``budgets`` says
what the machine-dependent budgets gave on this machine (SFT steps, value pretraining, RL steps).
Curves of each arm against minutes of training:
training episodes resolved (``rollout/reward_mean``: the reward is the guarded verdict), explained
variance, DIS-masked fraction, entropy; and a panel of resolved@1 before -> after.
"""
from __future__ import annotations

import base64
import html
import json
import os
import platform
from pathlib import Path

from sao_harness.core.files import atomic_write_text
from sao_harness.tasks.grading.grade_status import INFRA_FAILURES
from sao_harness.trainer.report.compare import summarize
from sao_harness.trainer.report.metrics import read_metrics
from sao_harness.trainer.report.plots import moving_average

CURVES = [("rollout/reward_mean", "training episodes resolved (reward)", 1.0),
          ("critic/explained_variance", "critic explained variance", 1.0),
          ("policy/dis_masked", "DIS-masked tokens (%)", 100.0),
          ("policy/entropy", "policy entropy (nats/token)", 1.0)]
WINDOW = 5
VALUE_DIR = "sao-value"  # the sao arm's value pretraining stages (sao.learn)
VALUE_STAGES = ("sao value data", "sao value pretrain")


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem = float("nan")
    return f"{os.cpu_count()} CPU cores ({cpu}), {mem:.0f} GB RAM, no GPU used"


def _pct(rate) -> str:
    return "-" if rate is None else f"{100 * rate:.1f}%"


def arm_metrics(arms: list[str], arm_dirs: dict[str, Path]) -> dict[str, list[dict]]:
    """Each arm's metrics.jsonl records ([] when it wrote none)."""
    return {arm: read_metrics(arm_dirs[arm]) if (arm_dirs[arm] / "metrics.jsonl").is_file() else [] for arm in arms}


def _summary(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def budgets(root: Path, seconds: dict[str, float]) -> dict:
    """What the machine-dependent budgets gave here: SFT steps; the sao arm's value pretraining (wall
    time of its two stages, the episodes it read, its steps); None where a stage did not run."""
    sft = _summary(root / "sft" / "sft" / "summary.json")
    vp = _summary(root / VALUE_DIR / "value_pretrain" / "summary.json")
    value_s = [seconds[n] for n in VALUE_STAGES if n in seconds]
    return {"sft_steps": sft.get("steps"),
            "value_pretrain": None if not value_s else {
                "seconds": round(sum(value_s), 1), "episodes": (vp.get("corpus") or {}).get("read"),
                "steps": vp.get("steps")}}


def _before_rl(policy: str, budget: dict) -> str:
    vp = budget.get("value_pretrain")
    if policy != "sao" or vp is None:
        return "-"
    return f"value pretraining {vp['seconds']:.0f} s ({vp['episodes'] or '?'} episodes, {vp['steps'] or '?'} steps)"


def rows(results: dict, runs: dict[str, list[dict]], budget: dict | None = None) -> list[dict]:
    """One row per evaluated policy (see the module doc); ``runs``: ``arm_metrics``; ``budget``: ``budgets``."""
    out = []
    for policy, r in results.items():
        row = {"policy": policy,
               "train": f"{_pct(r['train']['rate'])} ({r['train']['resolved']}/{r['train']['graded']})",
               "heldout": f"{_pct(r['heldout']['rate'])} ({r['heldout']['resolved']}/{r['heldout']['graded']})",
               INFRA_FAILURES: r["train"][INFRA_FAILURES] + r["heldout"][INFRA_FAILURES],
               "before": _before_rl(policy, budget or {}), "steps": "-", "trajectories": "-", "reward": "-"}
        records = runs.get(policy)
        if records:
            s = summarize(policy, records)
            trained = [r["rollout/trained_total"] for r in records if "rollout/trained_total" in r]
            row.update(steps=s["steps"], trajectories=int(trained[-1]) if trained else "-",
                       reward="-" if s["reward_first5"] is None else
                       f"{s['reward_first5']:.2f} -> {s['reward_last5']:.2f}")
        out.append(row)
    return out


COLUMNS = [("policy", "policy"), ("train", "resolved@1 train"), ("heldout", "resolved@1 held-out"),
           (INFRA_FAILURES, "no verdict"), ("before", "before RL"), ("steps", "RL steps"),
           ("trajectories", "trajectories trained"),
           ("reward", "train reward first5 -> last5")]


def markdown_table(table: list[dict]) -> str:
    head = "| " + " | ".join(t for _, t in COLUMNS) + " |\n|" + "---|" * len(COLUMNS) + "\n"
    return head + "".join("| " + " | ".join(str(r[k]) for k, _ in COLUMNS) + " |\n" for r in table)


def _plot(path: Path, results: dict, runs: dict[str, list[dict]]) -> None:
    import matplotlib  # lazy: heavy, only for the figure
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: heavy, only for the figure

    fig, axes = plt.subplots(1, len(CURVES) + 1, figsize=(4.6 * (len(CURVES) + 1), 3.8))
    colors = {arm: f"C{i}" for i, arm in enumerate(runs)}
    for ax, (key, title, scale) in zip(axes, CURVES):
        ax.set_title(title, fontsize=10)
        for arm, records in runs.items():
            pts = [(r["time"], r[key]) for r in records if isinstance(r.get(key), (int, float)) and "time" in r]
            if not pts:
                continue
            t0 = records[0]["time"]
            x = [(t - t0) / 60 for t, _ in pts]
            y = [v * scale for _, v in pts]
            ax.plot(x, y, color=colors[arm], alpha=0.25, linewidth=0.8)
            ax.plot(x, moving_average(y, WINDOW), color=colors[arm], linewidth=1.6, label=arm)
        ax.set_xlabel("minutes of training")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    ax = axes[-1]
    ax.set_title("resolved@1 (T=1): warm start -> after RL", fontsize=10)
    names = list(results)
    for j, split in enumerate(("train", "heldout")):
        vals = [100 * (results[n][split]["rate"] or 0.0) for n in names]
        ax.bar([i + 0.4 * j for i in range(len(names))], vals, width=0.4,
               label="training tasks" if split == "train" else "held-out tasks")
    ax.set_xticks([i + 0.2 for i in range(len(names))], names, fontsize=8)
    ax.set_ylabel("%")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def stage_table(stages: dict[str, str], seconds: dict[str, float]) -> str:
    """The HTML table of the stages: name, status, wall time."""
    rows = "".join(f"<tr><td>{html.escape(n)}</td><td>{html.escape(s)}</td><td>{seconds[n]:.0f} s</td></tr>"
                   for n, s in stages.items())
    return f"<table>{rows}</table>"


def html_page(title: str, headline: str, body: str) -> str:
    """A self-contained report page: ``title``, the headline in bold, then ``body`` (HTML)."""
    return ("<!doctype html><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><style>body{{font-family:sans-serif}}"
            "td,th{padding:2px 10px;text-align:right}td:first-child{text-align:left}</style>"
            f"<h1>{html.escape(title)}</h1><p><b>{html.escape(headline)}</b></p>{body}\n")


def write_report(out: Path, *, cfg, root: Path, results: dict, arms: list[str], arm_dirs: dict[str, Path],
                 stages: dict[str, str], seconds: dict[str, float], wall_s: float, headline: str) -> list[Path]:
    """Write the four files into ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    runs = arm_metrics(arms, arm_dirs)
    budget = budgets(root, seconds)
    table = rows(results, runs, budget)
    lc = cfg.learn
    facts = {"dir": str(root), "machine": machine(), "wall_s": round(wall_s, 1), "headline": headline,
             "train_tasks": lc.train_tasks, "heldout_tasks": lc.heldout_tasks, "samples": lc.samples,
             "minutes_per_arm": lc.minutes, "temperature": cfg.eval.temperature, "budgets": budget,
             "results": results, "table": table,
             "stages": {n: {"status": s, "seconds": round(seconds[n], 1)} for n, s in stages.items()}}
    files = [out / "learn.json", out / "learn.md", out / "learn.png", out / "learn.html"]
    atomic_write_text(files[0], json.dumps(facts, indent=2) + "\n")
    summary = (f"{len(lc.train_tasks)} training and {len(lc.heldout_tasks)} held-out tasks, {lc.samples} "
               f"sample(s) per task at T={cfg.eval.temperature:g}, {lc.minutes:g} min of RL per arm (every arm "
               f"the same); SFT: {budget['sft_steps'] or '-'} steps; {facts['machine']}; whole run "
               f"{wall_s / 60:.1f} min")
    atomic_write_text(files[1], f"# sao learn\n\n{headline}\n\n{summary}\n\n{markdown_table(table)}\n"
                                f"![curves](learn.png)\n")
    if results:
        _plot(files[2], results, runs)
    image = base64.b64encode(files[2].read_bytes()).decode() if files[2].is_file() else ""
    head = "".join(f"<th>{html.escape(t)}</th>" for _, t in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(r[k]))}</td>" for k, _ in COLUMNS) + "</tr>"
                   for r in table)
    atomic_write_text(files[3], html_page(
        "sao learn", headline, f"<p>{html.escape(summary)}</p><table><tr>{head}</tr>{body}</table>"
        + (f"<p><img alt='curves' src='data:image/png;base64,{image}'></p>" if image else "<p>no curves</p>")
        + f"<h2>stages</h2>{stage_table(stages, seconds)}<p>{html.escape(str(root))}</p>"))
    return [f for f in files if f.is_file()]
