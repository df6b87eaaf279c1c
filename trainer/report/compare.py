"""`sao runs compare RUN... [--out DIR]`: several runs' curves side by side, a PNG, an HTML report, a table.

For each run (a directory holding metrics.jsonl) the summary is

    reward first5 -> last5   mean of `rollout/reward_mean` over the first 5 and the last 5 logged steps
    rise                     last5 - first5
    EV last5                 mean `critic/explained_variance` over the last 5 steps that logged it ("-": none)
    masked last5             mean `policy/dis_masked` (DIS, low + high) over the last 5 steps ("-": none)
    wall                     seconds from the first record's time to the last one's

Writes `compare.png` (those three metrics, one panel each, one line per run) and
`compare.html` (the table and the PNG) into `--out` (default: the current directory); prints the
table and the paths.
"""
from __future__ import annotations

import base64
import html
from pathlib import Path

from sao_harness.core.errors import UserError
from sao_harness.trainer.report.metrics import read_metrics
from sao_harness.trainer.report.plots import _series, moving_average

WINDOW = 5
REWARD, EV, MASKED = "rollout/reward_mean", "critic/explained_variance", "policy/dis_masked"
PANELS = [(REWARD, "rollout/reward_mean (batch mean)", 1.0), (EV, EV, 1.0), (MASKED, f"{MASKED} (%)", 100.0)]
COLUMNS = ["run", "steps", "wall_s", "reward_first5", "reward_last5", "rise", "ev_last5", "masked_last5"]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(name: str, records: list[dict]) -> dict:
    """The table row of one run (see the module doc); None where a metric was never logged."""
    _, reward = _series(records, REWARD)
    _, ev = _series(records, EV)
    _, masked = _series(records, MASKED)
    first, last = _mean(reward[:WINDOW]), _mean(reward[-WINDOW:])
    times = [r["time"] for r in records if isinstance(r.get("time"), (int, float))]
    return {"run": name, "steps": len(records), "wall_s": (times[-1] - times[0]) if len(times) > 1 else None,
            "reward_first5": first, "reward_last5": last,
            "rise": None if first is None or last is None else last - first,
            "ev_last5": _mean(ev[-WINDOW:]), "masked_last5": _mean(masked[-WINDOW:])}


def _fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def table(rows: list[dict]) -> str:
    """A fixed-width text table of the summaries."""
    cells = [COLUMNS] + [[_fmt(r[c]) for c in COLUMNS] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells)


def _plot(runs: dict[str, list[dict]], path: Path) -> None:
    import matplotlib  # lazy: heavy, only for the figure
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: heavy, only for the figure

    colors = {name: f"C{i}" for i, name in enumerate(runs)}  # one colour per run, the same in every panel
    fig, axes = plt.subplots(1, len(PANELS), figsize=(5.2 * len(PANELS), 3.8), squeeze=False)
    for ax, (key, title, scale) in zip(axes[0], PANELS):
        ax.set_title(title)
        drawn = False
        for name, records in runs.items():
            x, y = _series(records, key)
            if not x:
                continue
            y = [v * scale for v in y]
            ax.plot(x, y, color=colors[name], alpha=0.25, linewidth=0.8)
            ax.plot(x, moving_average(y, WINDOW), color=colors[name], linewidth=1.6, label=name)
            drawn = True
        if drawn:
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, f"no data\n({key} never logged)", ha="center", va="center", transform=ax.transAxes,
                    color="0.4")
    fig.suptitle(f"{len(runs)} runs (lines: moving average over {WINDOW} steps; faint: per step)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _html(rows: list[dict], png: Path, path: Path) -> None:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(r[c]))}</td>" for c in COLUMNS) + "</tr>" for r in rows)
    image = base64.b64encode(png.read_bytes()).decode()
    path.write_text(
        "<!doctype html><meta charset='utf-8'><title>sao runs compare</title>"
        "<style>body{font-family:sans-serif}td,th{padding:2px 10px;text-align:right}td:first-child{text-align:left}"
        "</style><h1>sao runs compare</h1>"
        f"<table><tr>{head}</tr>{body}</table><p><img alt='curves' src='data:image/png;base64,{image}'></p>\n")


def compare_runs(run_dirs: list[str | Path], out_dir: str | Path = ".") -> tuple[list[dict], list[Path]]:
    """Summaries of the runs (in order) and the files written (compare.png, compare.html)."""
    runs: dict[str, list[dict]] = {}
    for d in map(Path, run_dirs):
        if not d.is_dir():
            raise UserError(f"run directory not found: {d}")
        records = read_metrics(d)
        if not records:
            raise UserError(f"{d}: no metrics to compare (metrics.jsonl missing or empty)")
        name = d.name if d.name not in runs else str(d)
        runs[name] = records
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create the output directory {out}: {e.strerror}") from None
    rows = [summarize(name, records) for name, records in runs.items()]
    png, page = out / "compare.png", out / "compare.html"
    _plot(runs, png)
    _html(rows, png, page)
    return rows, [png, page]


def cmd_runs_compare(args) -> int:
    """`sao runs compare RUN... [--out DIR]`: prints the table, then the paths written."""
    rows, paths = compare_runs(args.runs, args.out)
    print(table(rows))
    for p in paths:
        print(p)
    return 0
