"""`sao runs plot`: non-blank PNG curves, 'no data' handling, bad run directories."""
from __future__ import annotations

import argparse
import math

import pytest

from sao_harness.core.errors import UserError
from sao_harness.trainer.report.metrics import MetricsLogger
from sao_harness.trainer.report.plots import cmd_runs_plot, plot_run


def write_run(run_dir, steps=30, drop=()):
    with MetricsLogger(run_dir, tensorboard=False) as logger:
        for s in range(steps):
            low = 0.004 + 0.001 * math.sin(s)
            m = {"rollout/reward_mean": 0.2 + 0.5 * s / steps + 0.05 * math.sin(s),
                 "critic/explained_variance": 1 - math.exp(-s / 8), "policy/dis_masked_low": low,
                 "policy/dis_masked_high": 0.002, "policy/dis_masked": low + 0.002, "critic/grad_norm": 2.0 / (1 + s),
                 "rollout/version_lag_mean": 0.5 + s % 3, "rollout/staleness_mean": 1.0 + s % 2,
                 "loss/value_loss": 0.125 * math.exp(-s / 10), "perf/trajectories_per_hour": 100.0 + s,
                 "time/step_s": 2.0 + math.cos(s)}
            logger.log(s, {k: v for k, v in m.items() if k not in drop})


def assert_non_blank_png(path):
    import matplotlib.image as mpimg
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert img[..., :3].std() > 0.02, f"{path} looks blank"


@pytest.mark.slow  # renders every figure
def test_every_curve_is_a_non_blank_png(tmp_path, capsys):
    run = tmp_path / "run"
    write_run(run)
    paths = plot_run(run)
    names = sorted(p.name for p in paths)
    assert names == sorted(f"{f}.png" for f in ("loss", "critic", "policy", "rollout", "perf", "time", "overview"))
    for p in paths:
        assert p.parent == run / "plots" and p.is_file()
        assert_non_blank_png(p)
    assert "no data" not in capsys.readouterr().out


def test_a_family_without_data_is_skipped_with_a_note(tmp_path, capsys):
    run = tmp_path / "run"
    write_run(run, steps=8, drop=("perf/trajectories_per_hour", "time/step_s"))
    with MetricsLogger(run, tensorboard=False) as logger:  # nan only: no data either; no family: never plotted
        logger.log(8, {"time/wait_s": float("nan"), "unfiled": 1.0})
    out = tmp_path / "elsewhere"
    paths = plot_run(run, out)
    names = {p.name for p in paths}
    assert names == {"loss.png", "critic.png", "policy.png", "rollout.png", "overview.png"}
    assert all(p.parent == out for p in paths) and not (run / "plots").exists()
    printed = capsys.readouterr().out
    assert "no data for perf/ (no perf/* metric logged): skipped" in printed
    assert "no data for time/" in printed
    assert_non_blank_png(out / "overview.png")


def test_value_pretraining_curves_and_the_command_prints_the_paths(tmp_path, capsys):
    run = tmp_path / "run"
    write_run(run, steps=5)
    with MetricsLogger(run / "value_pretrain", tensorboard=False) as logger:
        for s in range(1, 12):
            logger.log(s, {"loss/value_loss": 0.2 / s, "critic/explained_variance": 1 - 1 / s,
                           "critic/grad_norm": 1.0 / s, "time/step_s": 0.1})
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
    from sao_harness.sao.cli import build_parser, main
    try:
        func = build_parser().parse_args(["runs", "plot", str(tmp_path)]).func
    except SystemExit:
        func = None
    if getattr(func, "__name__", "") != "cmd_runs_plot":
        pytest.skip("`sao runs plot` is not wired to trainer.report.plots.cmd_runs_plot in trainer/cli.py yet")
    capsys.readouterr()
    assert main(["runs", "plot", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "run directory not found" in err and "missing" in err


def test_runs_compare_writes_png_html_and_a_table(tmp_path, capsys):
    from sao_harness.trainer.report.compare import cmd_runs_compare

    write_run(tmp_path / "a", steps=20)
    write_run(tmp_path / "b", steps=10, drop=("critic/explained_variance",))
    assert cmd_runs_compare(argparse.Namespace(runs=[str(tmp_path / "a"), str(tmp_path / "b")],
                                               out=str(tmp_path / "cmp"))) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:6] == ["run", "steps", "wall_s", "reward_first5", "reward_last5", "rise"]
    a, b = out[1].split(), out[2].split()
    assert a[0] == "a" and a[1] == "20" and float(a[5]) > 0.3  # the rising reward of write_run
    assert b[0] == "b" and b[6] == "-"  # explained variance never logged
    assert_non_blank_png(tmp_path / "cmp" / "compare.png")
    assert "<table>" in (tmp_path / "cmp" / "compare.html").read_text()
    with pytest.raises(UserError, match="no metrics"):
        cmd_runs_compare(argparse.Namespace(runs=[str(tmp_path)], out=str(tmp_path / "cmp")))
