"""`sao runs plot`: non-blank PNG curves, 'no data' handling, bad run directories."""
from __future__ import annotations

import argparse
import math

import pytest

from core.errors import UserError
from trainer.metrics import MetricsLogger
from trainer.plots import PANELS, cmd_runs_plot, plot_run

def write_run(run_dir, steps=30, drop=()):
    with MetricsLogger(run_dir, tensorboard=False) as logger:
        for s in range(steps):
            m = {"reward_mean": 0.2 + 0.5 * s / steps + 0.05 * math.sin(s), "explained_variance": 1 - math.exp(-s / 8),
                 "dis_masked_low_frac": 0.004 + 0.001 * math.sin(s), "dis_masked_high_frac": 0.002,
                 "critic_grad_norm": 2.0 / (1 + s), "version_lag_mean": 0.5 + s % 3, "version_lag_max": 2 + s % 4,
                 "staleness_mean": 1.0 + s % 2, "staleness_max": 3.0,
                 "value_loss": 0.125 * math.exp(-s / 10)}
            logger.log(s, {k: v for k, v in m.items() if k not in drop})


def assert_non_blank_png(path):
    import matplotlib.image as mpimg
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert img[..., :3].std() > 0.02, f"{path} looks blank"


def test_every_curve_is_a_non_blank_png(tmp_path, capsys):
    run = tmp_path / "run"
    write_run(run)
    paths = plot_run(run)
    names = sorted(p.name for p in paths)
    assert names == sorted([f"{p[0]}.png" for p in PANELS] + ["overview.png"])
    for p in paths:
        assert p.parent == run / "plots" and p.is_file()
        assert_non_blank_png(p)
    assert "no data" not in capsys.readouterr().out


def test_missing_metrics_are_skipped_with_a_note_and_shown_as_no_data(tmp_path, capsys):
    run = tmp_path / "run"
    write_run(run, steps=8, drop=("version_lag_mean", "version_lag_max", "staleness_mean", "staleness_max",
                                  "critic_grad_norm"))
    out = tmp_path / "elsewhere"
    paths = plot_run(run, out)
    names = {p.name for p in paths}
    assert "staleness.png" not in names and "critic_grad_norm.png" not in names
    assert {"reward.png", "value_loss.png", "overview.png"} <= names
    assert all(p.parent == out for p in paths) and not (run / "plots").exists()
    printed = capsys.readouterr().out
    assert ("no data for staleness (version_lag_mean, version_lag_max, staleness_mean, staleness_max never "
            "logged): skipped") in printed
    assert "no data for critic_grad_norm" in printed
    assert_non_blank_png(out / "overview.png")


def test_value_pretraining_curves_and_the_command_prints_the_paths(tmp_path, capsys):
    run = tmp_path / "run"
    write_run(run, steps=5)
    with MetricsLogger(run / "value_pretrain", tensorboard=False) as logger:
        for s in range(1, 12):
            logger.log(s, {"value_loss": 0.2 / s, "explained_variance": 1 - 1 / s, "critic_grad_norm": 1.0 / s})
    assert cmd_runs_plot(argparse.Namespace(run=str(run), out=None)) == 0
    printed = capsys.readouterr().out.splitlines()
    assert str(run / "plots" / "value_pretrain.png") in printed
    assert str(run / "plots" / "overview.png") in printed
    assert_non_blank_png(run / "plots" / "value_pretrain.png")


def test_bad_run_dirs_are_one_line_user_errors(tmp_path):
    with pytest.raises(UserError, match="run directory not found") as e:
        plot_run(tmp_path / "missing")
    assert "\n" not in str(e.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no metrics to plot") as e:
        plot_run(tmp_path / "empty")
    assert "\n" not in str(e.value)
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "metrics.jsonl").write_text('{"step": 0, "ti')
    with pytest.raises(UserError, match="no metrics to plot"):
        plot_run(tmp_path / "torn")


def test_cli_runs_plot_bad_run_dir_exits_2_with_one_line(tmp_path, capsys):
    from sao.cli import build_parser, main
    try:
        func = build_parser().parse_args(["runs", "plot", str(tmp_path)]).func
    except SystemExit:
        func = None
    if getattr(func, "__name__", "") != "cmd_runs_plot":
        pytest.skip("`sao runs plot` is not wired to trainer.plots.cmd_runs_plot in trainer/cli.py yet")
    capsys.readouterr()
    assert main(["runs", "plot", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "run directory not found" in err and "missing" in err
