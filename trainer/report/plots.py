"""`sao runs plot RUN [--out DIR]`: PNG curves of a run's metrics.jsonl, one figure per metric family.

Writes into ``<run>/plots/`` (or ``--out``) ``<family>.png`` for each family of trainer.report.metrics.FAMILIES
that has data (one panel per metric of the family; a family without data gets a note), and
``overview.png``: the key metrics (the console line's, trainer.report.metrics.CONSOLE). A run with value
pretraining (``<run>/value_pretrain/metrics.jsonl``) also gets ``value_pretrain.png`` (its loss/ and
critic/ metrics). Prints the paths written.
"""
from __future__ import annotations

import math
from pathlib import Path

from sao_harness.core.errors import UserError
from sao_harness.trainer.report.metrics import CONSOLE, FAMILIES, METRICS_FILE, family, read_metrics

MAX_COLS = 4


def _series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return [p[0] for p in pts], [p[1] for p in pts]


def moving_average(y: list[float], window: int) -> list[float]:
    """Trailing mean over the last `window` values (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(y):
        total += v
        if i >= window:
            total -= y[i - window]
        out.append(total / min(i + 1, window))
    return out


def family_keys(records: list[dict], families=tuple(FAMILIES)) -> dict[str, list[str]]:
    """{family: its metric names with at least one finite value, sorted}, for the families with data."""
    keys = sorted({k for r in records for k, v in r.items()
                   if family(k) in families and isinstance(v, (int, float)) and math.isfinite(v)})
    return {f: [k for k in keys if family(k) == f] for f in families if any(family(k) == f for k in keys)}


def _draw(ax, records: list[dict], key: str, title: str) -> None:
    """One metric's curve on `ax`: raw points, or (20 steps or more) raw faintly and a moving average."""
    x, y = _series(records, key)
    ax.set_title(title, fontsize=10)
    if len(x) >= 20:  # noisy per-step values
        line, = ax.plot(x, y, alpha=0.3, linewidth=0.8)
        ax.plot(x, moving_average(y, max(5, len(x) // 20)), color=line.get_color(), linewidth=1.6)
    else:
        ax.plot(x, y, marker="o", markersize=3, linewidth=1.4)
    ax.set_xlabel("step", fontsize=8)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)


def _grid(records: list[dict], keys: list[str], title: str, path: Path, short: bool) -> None:
    """One figure, a panel per metric (titled without its family when `short`), saved to `path`."""
    import matplotlib.pyplot as plt  # lazy: heavy, only for the figures
    cols = min(MAX_COLS, len(keys))
    rows = -(-len(keys) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        _draw(ax, records, key, key.partition("/")[2] if short else key)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Write the run's curves as PNGs; return their paths. UserError for a directory without metrics."""
    import matplotlib  # lazy: heavy, only for the figures
    matplotlib.use("Agg")

    run = Path(run_dir)
    if not run.is_dir():
        raise UserError(f"run directory not found: {run}")
    records = read_metrics(run)
    pretrain = read_metrics(run / "value_pretrain")
    if not records and not pretrain:
        raise UserError(f"{run}: no metrics to plot ({METRICS_FILE} missing or empty: not a run directory, "
                        "or no step logged yet)")
    out = Path(out_dir) if out_dir is not None else run / "plots"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create the plot directory {out}: {e.strerror}") from None
    written: list[Path] = []
    if records:
        by_family = family_keys(records)
        for fam in FAMILIES:
            if fam not in by_family:
                print(f"note: no data for {fam}/ (no {fam}/* metric logged): skipped")
                continue
            path = out / f"{fam}.png"
            _grid(records, by_family[fam], f"{run.name}: {fam}/ ({len(records)} steps)", path, short=True)
            written.append(path)
        key_metrics = [k for k in CONSOLE if _series(records, k)[0]]
        if key_metrics:
            path = out / "overview.png"
            _grid(records, key_metrics, f"{run.name}: {len(records)} steps", path, short=False)
            written.append(path)
    pretrain_keys = [k for keys in family_keys(pretrain, ("loss", "critic")).values() for k in keys]
    if pretrain_keys:
        path = out / "value_pretrain.png"
        _grid(pretrain, pretrain_keys, f"{run.name}: value pretraining, {len(pretrain)} steps", path, short=False)
        written.append(path)
    return written


def cmd_runs_plot(args) -> int:
    """`sao runs plot RUN [--out DIR]`: args.run (a run directory), args.out (optional)."""
    paths = plot_run(args.run, getattr(args, "out", None))
    for p in paths:
        print(p)
    return 0
