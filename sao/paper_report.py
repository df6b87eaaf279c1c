"""The report of `sao paper`: ``paper.json``, ``paper.md``, ``paper.png`` (one panel per claim) and ``paper.html``.

Each panel is in the paper's style: the claim's arms' curves over policy steps (C2: over trajectories
sampled; C6 and C7: bars), each arm's mean over seeds with its 95% band (t over seeds, as the verdicts).
The markdown and HTML hold the summary line, the plan, one table row per claim (the paper's result, ours,
the verdict), each claim's figures per arm, and the machine and wall time.
"""
from __future__ import annotations

import base64
import html
import json
import math
from itertools import accumulate
from pathlib import Path

from sao_harness.core.files import atomic_write_text
from sao_harness.sao.learn_report import html_page, machine
from sao_harness.sao.paper_arms import CLAIMS
from sao_harness.sao.paper_claims import ClaimResult, counts, trajectories_per_minute
from sao_harness.sao.paper_stats import EV, REWARD, interval, policy_steps, series
from sao_harness.trainer.report.plots import moving_average

SMOOTH = 5
BARS = {"C6": ("mean reward over the run", lambda r: sum(series(r, REWARD)) / max(1, len(series(r, REWARD)))),
        "C7": ("trajectories per minute", trajectories_per_minute)}
CURVE_KEY = {"C3": (EV, "critic explained variance")}


def summary_line(results: list[ClaimResult], plan, minutes: float, tag: str = "") -> str:
    rep, con, inc = counts(results)
    seeds = plan.seeds if plan.seeds == plan.c1_seeds else f"{plan.seeds}-{plan.c1_seeds}"
    return (f"paper: {rep} of {len(results)} claims reproduced, {con} contradicted, {inc} inconclusive "
            f"({seeds} seeds, {minutes:.0f} min){tag}")


def band(runs: list[list[dict]], key: str) -> tuple[list[int], list[float], list[float]]:
    """Step index, mean over seeds and 95% half-width of the smoothed `key` (steps every seed reached)."""
    curves = [moving_average([v for v in series(r, key) if v == v], SMOOTH) for r in runs]
    curves = [c for c in curves if c]
    n = min((len(c) for c in curves), default=0)
    xs, ms, hs = [], [], []
    for i in range(n):
        iv = interval([c[i] for c in curves])
        xs.append(i + 1)
        ms.append(iv.mean)
        hs.append(0.0 if math.isnan(iv.half) else iv.half)
    return xs, ms, hs


def _plot(path: Path, results: list[ClaimResult], runs: dict[str, list[list[dict]]], plan) -> None:
    import matplotlib  # lazy: heavy, only for the figure
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: heavy, only for the figure

    cols = min(4, len(results))
    rows = (len(results) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 4 * rows), squeeze=False)
    for ax, res in zip(axes.flat, results):
        claim = next(c for c in CLAIMS if c.id == res.id)
        ax.set_title(f"{claim.id} {claim.title}: {res.verdict}", fontsize=10)
        ax.grid(alpha=0.3)
        if claim.id in BARS:
            label, fn = BARS[claim.id]
            ivs = [interval([fn(r) for r in runs[arm]]) for arm in claim.arms]
            ax.bar(range(len(ivs)), [0 if math.isnan(i.mean) else i.mean for i in ivs],
                   yerr=[0 if math.isnan(i.half) else i.half for i in ivs], color=[f"C{i}" for i in range(len(ivs))],
                   capsize=3)
            ax.set_xticks(range(len(ivs)), claim.arms, rotation=20, fontsize=8)
            ax.set_ylabel(label, fontsize=8)
            continue
        key, ylabel = CURVE_KEY.get(claim.id, (REWARD, "reward (5-step mean)"))
        for i, arm in enumerate(claim.arms):
            xs, ms, hs = band(runs[arm], key)
            if claim.id == "C2" and xs:  # over trajectories sampled: the seeds' mean cumulative count at each step
                cum = [list(accumulate(float(x.get("rollout/trajectories", 0)) for x in policy_steps(r)))
                       for r in runs[arm]]
                xs = [sum(c[j] for c in cum) / len(cum) for j in range(len(xs))]
            ax.plot(xs, ms, color=f"C{i}", label=arm, linewidth=1.2)
            ax.fill_between(xs, [m - h for m, h in zip(ms, hs)], [m + h for m, h in zip(ms, hs)], color=f"C{i}",
                            alpha=0.15)
        if claim.id == "C8":  # the preference shifts
            for k in range(1, plan.steps // plan.shift_every + 1):
                ax.axvline(k * plan.shift_every, color="grey", linestyle="--", linewidth=0.8)
        ax.set_xlabel("trajectories sampled" if claim.id == "C2" else "policy step", fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _figures_md(res: ClaimResult) -> list[str]:
    names = sorted({k for figs in res.figures.values() for k in figs})
    out = [f"| arm | {' | '.join(names)} |", "|---|" + "---|" * len(names)]
    for arm, figs in res.figures.items():
        out.append(f"| {arm} | " + " | ".join(figs[k].text(3) if k in figs else "-" for k in names) + " |")
    return out


def write_report(root: Path, results: list[ClaimResult], runs: dict[str, list[list[dict]]], plan, pc,
                 minutes: float, failed: list[str]) -> list[Path]:
    """Write the four files into `root`; returns their paths."""
    tag = " (quick)" if plan.quick else ""
    headline = summary_line(results, plan, minutes, tag)
    files = [root / "paper.json", root / "paper.md", root / "paper.png", root / "paper.html"]
    facts = {"dir": str(root), "machine": machine(), "minutes": round(minutes, 1), "plan": plan.to_dict(),
             "lr": pc.lr, "critic_lr": 5 * pc.lr, "collapse_drop": pc.collapse_drop, "failed_runs": failed,
             "headline": headline, "claims": [r.to_dict() for r in results],
             "seeds_finished": {arm: len(v) for arm, v in runs.items()}}
    atomic_write_text(files[0], json.dumps(facts, indent=2) + "\n")
    md = [f"# sao paper{tag}", "", f"**{headline}**", "",
          f"{plan.steps} policy steps per run, {plan.seeds} seeds per arm ({plan.c1_seeds} for C1), lr {pc.lr:g} "
          f"(critic {5 * pc.lr:g}), value pretraining {plan.pretrain_steps} critic-only updates, C8's preference "
          f"shift every {plan.shift_every} steps; {facts['machine']}; {minutes:.0f} min.", "",
          "| claim | the paper | here | verdict |", "|---|---|---|---|"]
    md += [f"| {r.id} {r.title} | {r.paper} | {r.detail} | {r.verdict} |" for r in results]
    md += ["", "![figures](paper.png)", ""]
    for r in results:
        md += [f"## {r.id} {r.title}: {r.verdict}", "", r.detail, "", *_figures_md(r), "", *r.notes, ""]
    if failed:
        md += [f"Failed runs (left out): {', '.join(failed)}", ""]
    atomic_write_text(files[1], "\n".join(md))
    _plot(files[2], results, runs, plan)
    png = base64.b64encode(files[2].read_bytes()).decode()
    rows = "".join(f"<tr><td>{html.escape(r.id + ' ' + r.title)}</td><td>{html.escape(r.paper)}</td>"
                   f"<td>{html.escape(r.detail)}</td><td>{r.verdict}</td></tr>" for r in results)
    body = (f"<p>{html.escape(md[4])}</p><table><tr><th>claim</th><th>the paper</th><th>here</th><th>verdict</th>"
            f"</tr>{rows}</table><img src='data:image/png;base64,{png}' style='max-width:100%'>")
    atomic_write_text(files[3], html_page(f"sao paper{tag}", headline, body))
    return files
