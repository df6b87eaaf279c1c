"""The report of `sao demo`: ``demo.json``, ``demo.png`` (one overview figure) and ``demo.html``.

Figure panels, each drawn only when it has data (a metric never logged is left out, not drawn flat):
the test-bed's reward and the critic's explained variance per SAO step; the real-path SAO run's
training-episode reward (the guarded verdict) per step; and the resolved bars of base -> sft -> sao
with their episode counts. The HTML page has the headline, the stages with their wall times, the
figure, and links to every evaluation's report and to both runs' metrics.
"""
from __future__ import annotations

import base64
import html
import json
import os
from pathlib import Path

from sao_harness.core.files import atomic_write_text
from sao_harness.sao.learn_report import html_page, machine, stage_table
from sao_harness.trainer.report.metrics import read_metrics
from sao_harness.trainer.report.plots import moving_average

# (run, metric, panel title, scale)
CURVES = [("toy", "rollout/reward_mean", "test-bed: reward per SAO step", 1.0),
          ("toy", "critic/explained_variance", "test-bed: critic explained variance", 1.0),
          ("sao", "rollout/reward_mean", "real path: SAO training episodes resolved", 1.0)]
WINDOW = 5


def _series(records: list[dict], key: str) -> tuple[list[float], list[float]]:
    pts = [(r["step"], r[key]) for r in records
           if isinstance(r.get(key), (int, float)) and r[key] == r[key] and "step" in r]  # r == r: not nan
    return [float(s) for s, _ in pts], [float(v) for _, v in pts]


def panels(runs: dict[str, list[dict]], resolved: dict[str, dict]) -> list[tuple]:
    """The panels with data: ("curve", title, x, y) and ("bars", title, names, rates, counts)."""
    out = []
    for run, key, title, scale in CURVES:
        x, y = _series(runs.get(run, []), key)
        if x:
            out.append(("curve", title, x, [v * scale for v in y]))
    graded = {p: r for p, r in resolved.items() if r["graded"]}
    if graded:
        out.append(("bars", "resolved at T=1 (episodes graded)", list(graded),
                    [100 * r["rate"] for r in graded.values()], [r["graded"] for r in graded.values()]))
    return out


def _plot(path: Path, items: list[tuple]) -> None:
    import matplotlib  # lazy: heavy, only for the figure
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: heavy, only for the figure

    fig, axes = plt.subplots(1, len(items), figsize=(4.4 * len(items), 3.6), squeeze=False)
    for ax, item in zip(axes[0], items):
        ax.set_title(item[1], fontsize=10)
        ax.grid(alpha=0.3)
        if item[0] == "curve":
            _, _, x, y = item
            ax.plot(x, y, color="C0", alpha=0.3, linewidth=0.8)
            ax.plot(x, moving_average(y, WINDOW), color="C0", linewidth=1.8)
            ax.set_xlabel("step")
        else:
            _, _, names, rates, counts = item
            bars = ax.bar(names, rates, color=[f"C{i + 1}" for i in range(len(names))])
            for bar, rate, n in zip(bars, rates, counts):
                ax.annotate(f"{rate:.0f}% (n={n})", (bar.get_x() + bar.get_width() / 2, rate), ha="center",
                            va="bottom", fontsize=8)
            ax.set_ylim(0, 105)
            ax.set_ylabel("%")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _metrics(run_dir: Path) -> list[dict]:
    return read_metrics(run_dir) if (run_dir / "metrics.jsonl").is_file() else []


def write_demo_report(root: Path, *, toy_dir: Path, sao_dir: Path, toy: dict, resolved: dict[str, dict],
                      evals: dict[str, list[Path]], stages: dict[str, str], seconds: dict[str, float],
                      wall_s: float, headline: str) -> list[Path]:
    """Write ``demo.json``, ``demo.png`` (when a panel has data) and ``demo.html`` into ``root``."""
    runs = {"toy": _metrics(toy_dir), "sao": _metrics(sao_dir)}
    items = panels(runs, resolved)
    files = [root / "demo.json", root / "demo.png", root / "demo.html"]
    facts = {"dir": str(root), "machine": machine(), "demo_s": round(wall_s, 1), "headline": headline,
             "toy": toy, "resolved": resolved,
             "stages": {n: {"status": s, "seconds": round(seconds[n], 1)} for n, s in stages.items()}}
    atomic_write_text(files[0], json.dumps(facts, indent=2, default=str) + "\n")
    if items:
        _plot(files[1], items)
    image = base64.b64encode(files[1].read_bytes()).decode() if files[1].is_file() else ""
    links = [(f"eval {policy} sample {i + 1}", d / "report.html") for policy, dirs in evals.items()
             for i, d in enumerate(dirs)]
    links += [("test-bed metrics", toy_dir / "metrics.jsonl"), ("SAO metrics", sao_dir / "metrics.jsonl")]
    link_items = "".join(f"<li><a href='{html.escape(os.path.relpath(p, root))}'>{html.escape(name)}</a></li>"
                         for name, p in links if p.is_file())
    atomic_write_text(files[2], html_page(
        "sao demo", headline, f"<p>{html.escape(machine())}; demo time {wall_s / 60:.1f} min (setup excluded)</p>"
        + (f"<p><img alt='curves and resolved rates' src='data:image/png;base64,{image}'></p>" if image else "")
        + f"<h2>reports</h2><ul>{link_items}</ul><h2>stages</h2>{stage_table(stages, seconds)}"
        f"<p>{html.escape(str(root))}</p>"))
    return [f for f in files if f.is_file()]
