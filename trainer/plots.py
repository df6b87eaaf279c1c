"""`sao runs plot RUN [--out DIR]`: PNG curves of a run's metrics.jsonl (matplotlib, Agg backend).

Writes into ``<run>/plots/`` (or ``--out``) one PNG per panel that has data, plus ``overview.png``
with every panel (a panel without data says so). A run with value pretraining
(``<run>/value_pretrain/metrics.jsonl``) also gets ``value_pretrain.png``. Prints the paths written.
"""
from __future__ import annotations

import math
from pathlib import Path

from core.errors import UserError
from trainer.metrics import METRICS_FILE, read_metrics

# (file stem, title, y label, [(metric key, legend label)], scale applied to the values)
PANELS = [
    ("reward", "Reward", "mean reward", [("reward_mean", "reward (batch mean)")], 1.0),
    ("explained_variance", "Explained variance", "1 - Var(G - V) / Var(G)",
     [("explained_variance", "explained variance")], 1.0),
    ("masked_fraction", "DIS masked fraction", "% of action tokens",
     [("dis_masked_low_frac", "low side (r <= 1 - eps_low)"), ("dis_masked_high_frac", "high side (r >= 1 + eps_high)")],
     100.0),
    ("critic_grad_norm", "Critic gradient norm", "grad norm (before clipping)", [("critic_grad_norm", "critic")], 1.0),
    ("staleness", "Staleness (policy-version lag)", "versions",
     [("version_lag_mean", "per action token, mean"), ("version_lag_max", "per action token, max"),
      ("staleness_mean", "per trajectory (oldest token), mean"), ("staleness_max", "per trajectory, max")], 1.0),
    ("value_loss", "Value loss", "0.5 (V - G)^2", [("value_loss", "value loss")], 1.0),
]
VALUE_PRETRAIN_PANELS = [next(p for p in PANELS if p[0] == stem)
                         for stem in ("value_loss", "explained_variance", "critic_grad_norm")]


def _series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return [p[0] for p in pts], [p[1] for p in pts]


def _moving_average(y: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(y):
        total += v
        if i >= window:
            total -= y[i - window]
        out.append(total / min(i + 1, window))
    return out


def _draw(ax, records: list[dict], panel) -> bool:
    """Draw one panel on `ax`; return False (and draw a 'no data' note) when none of its metrics has data."""
    _, title, ylabel, keys, scale = panel
    ax.set_title(title)
    drawn = False
    for key, label in keys:
        x, y = _series(records, key)
        if not x:
            continue
        y = [v * scale for v in y]
        if len(x) >= 20:  # noisy per-step values: raw faintly, a moving average on top
            line, = ax.plot(x, y, alpha=0.3, linewidth=0.8)
            ax.plot(x, _moving_average(y, max(5, len(x) // 20)), color=line.get_color(), linewidth=1.6,
                    label=f"{label} (moving avg)")
        else:
            ax.plot(x, y, marker="o", markersize=3, linewidth=1.4, label=label)
        drawn = True
    if drawn:
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, f"no data\n({', '.join(k for k, _ in keys)} never logged)", ha="center",
                va="center", transform=ax.transAxes, fontsize=10, color="0.4")
        ax.set_xticks([])
        ax.set_yticks([])
    return drawn


def _grid(records: list[dict], panels, title: str, path: Path) -> None:
    import matplotlib.pyplot as plt
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels):
        _draw(ax, records, panel)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Write the run's curves as PNGs; return their paths. UserError for a directory without metrics."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
        for panel in PANELS:
            stem, keys = panel[0], [k for k, _ in panel[3]]
            if not any(_series(records, k)[0] for k in keys):
                print(f"note: no data for {stem} ({', '.join(keys)} never logged): skipped")
                continue
            fig, ax = plt.subplots(figsize=(6.4, 4.0))
            _draw(ax, records, panel)
            fig.tight_layout()
            path = out / f"{stem}.png"
            fig.savefig(path, dpi=100)
            plt.close(fig)
            written.append(path)
        path = out / "overview.png"
        _grid(records, PANELS, f"{run.name}: {len(records)} steps", path)
        written.append(path)
    if pretrain:
        path = out / "value_pretrain.png"
        _grid(pretrain, VALUE_PRETRAIN_PANELS, f"{run.name}: value pretraining, {len(pretrain)} steps", path)
        written.append(path)
    return written


def cmd_runs_plot(args) -> int:
    """`sao runs plot RUN [--out DIR]`: args.run (a run directory), args.out (optional)."""
    paths = plot_run(args.run, getattr(args, "out", None))
    for p in paths:
        print(p)
    return 0
