"""MetricsLogger: JSONL round trip, torn-line tolerance, TensorBoard scalars; the progress line."""
from __future__ import annotations

import json
import math

import pytest

from sao_harness.trainer.report.metrics import CONSOLE, FAMILIES, MetricsLogger, family, progress_line, read_metrics


def test_jsonl_round_trip_with_step_time_and_null_for_non_finite(tmp_path):
    logged = [{"rollout/reward_mean": 0.25 * i, "critic/explained_variance": float("nan") if i == 1 else 0.1 * i,
               "rollout/action_tokens": i * 10} for i in range(3)]
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        for step, m in enumerate(logged):
            logger.log(step, m)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3
    assert all(json.loads(line) for line in lines)  # strict JSON: no NaN literal
    assert "NaN" not in (tmp_path / "metrics.jsonl").read_text()
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [0, 1, 2]
    for rec, m in zip(records, logged):
        assert isinstance(rec["time"], float) and rec["time"] > 1e9
        assert rec["rollout/reward_mean"] == m["rollout/reward_mean"]
        assert rec["rollout/action_tokens"] == float(m["rollout/action_tokens"])
        ev = m["critic/explained_variance"]
        assert rec["critic/explained_variance"] == (None if math.isnan(ev) else ev)
    assert read_metrics(tmp_path / "metrics.jsonl") == records  # the file itself works too
    assert read_metrics(tmp_path / "nothing-here") == []


def test_every_line_is_fsynced(tmp_path, monkeypatch):
    import sao_harness.trainer.report.metrics as metrics_mod
    calls = []
    real = metrics_mod.os.fsync
    monkeypatch.setattr(metrics_mod.os, "fsync", lambda fd: (calls.append(fd), real(fd)))
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        for step in range(4):
            logger.log(step, {"x": step})
            assert len(calls) == step + 1
            # already on disk before close: a reader sees it
            assert read_metrics(tmp_path)[-1]["step"] == step


def test_torn_last_line_is_skipped_and_the_next_run_starts_a_fresh_line(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log(0, {"x": 0.0})
        logger.log(1, {"x": 1.0})
    path = tmp_path / "metrics.jsonl"
    with open(path, "ab") as f:  # a kill in the middle of writing step 2
        f.write(b'{"step": 2, "time": 1700000000.0, "x": 2.')
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1]
    with MetricsLogger(tmp_path, tensorboard=False) as logger:  # the run resumes at step 2
        logger.log(2, {"x": 2.0})
        logger.log(3, {"x": 3.0})
    with pytest.warns(UserWarning, match="skipping unreadable line 3"):
        records = read_metrics(tmp_path)
    assert [(r["step"], r["x"]) for r in records] == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0)]


def test_a_resumed_run_supersedes_the_steps_it_logs_again(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        for step in range(5):
            logger.log(step, {"x": float(step)})
    with MetricsLogger(tmp_path, tensorboard=False) as logger:  # resumed from the checkpoint of step 2
        for step in range(3, 6):
            logger.log(step, {"x": 10.0 + step})
    assert [(r["step"], r["x"]) for r in read_metrics(tmp_path)] == [
        (0, 0.0), (1, 1.0), (2, 2.0), (3, 13.0), (4, 14.0), (5, 15.0)]


def test_bad_metrics_are_rejected_with_the_key(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        with pytest.raises(ValueError, match="'status' must be a number"):
            logger.log(0, {"status": "ok"})
        with pytest.raises(ValueError, match="reserved"):
            logger.log(0, {"step": 3.0})
    with pytest.raises(ValueError, match="after close"):
        logger.log(1, {"x": 1.0})


def test_tensorboard_event_file_holds_the_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsLogger(tmp_path) as logger:
        for step in range(1, 4):
            logger.log(step, {"loss/value_loss": 1.0 / step, "rollout/reward_mean": 0.1 * step,
                              "critic/explained_variance": float("nan") if step == 2 else 0.5})
    events = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert events, "no TensorBoard event file"
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert {"loss/value_loss", "rollout/reward_mean", "critic/explained_variance"} <= set(acc.Tags()["scalars"])
    loss = acc.Scalars("loss/value_loss")
    assert [e.step for e in loss] == [1, 2, 3]
    assert [e.value for e in loss] == pytest.approx([1.0, 0.5, 1 / 3])
    assert [e.step for e in acc.Scalars("critic/explained_variance")] == [1, 3]  # nan is not written


def test_progress_line_shows_the_console_metrics_a_step_logged():
    metrics = {"rollout/reward_mean": 0.375, "policy/dis_masked": 0.006, "critic/explained_variance": 0.4213,
               "perf/trajectories_per_hour": 85.25, "perf/engine_idle_frac": 0.031, "rollout/queue_depth": 3.0}
    line = progress_line(12, metrics)
    assert "\n" not in line
    assert line == ("step 12 | rollout/reward_mean 0.375 | critic/explained_variance 0.421 | policy/dis_masked 0.60% "
                    "| perf/trajectories_per_hour 85.2 | perf/engine_idle_frac 3%")
    # a non-finite value shows as "-"; a metric the step did not log (PPO: no dis_masked) is left out
    sparse = progress_line(0, {"critic/explained_variance": float("nan"), "policy/clip_frac": 0.125})
    assert sparse == "step 0 | critic/explained_variance - | policy/clip_frac 12.50%"


def test_families_and_the_console_table():
    assert list(FAMILIES) == ["loss", "critic", "policy", "rollout", "perf", "time"]
    assert family("critic/grad_norm") == "critic" and family("time/wait_s") == "time"
    assert family("reward_mean") is None and family("charts/sps") is None and family("step") is None
    assert all(family(k) for k in CONSOLE)


@pytest.mark.parametrize("uid", [0, 9])
def test_tensorboard_of_a_resumed_run_shows_the_new_values(tmp_path, monkeypatch, uid):
    """Also when the resumed file's counter is 10 and the first's 9 (as text, 10 sorts first; the run's
    file then must begin a second later: with both in one second, TensorBoard read the resumed file first)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.summary.writer import event_file_writer

    monkeypatch.setattr(event_file_writer, "_global_uid", event_file_writer.AtomicCounter(uid))
    with MetricsLogger(tmp_path) as logger:
        for step in range(5):
            logger.log(step, {"x": float(step)})
    with MetricsLogger(tmp_path) as logger:  # resumed from the checkpoint of step 2
        for step in range(3, 6):
            logger.log(step, {"x": 10.0 + step})
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("x")] == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 13.0), (4, 14.0),
                                                            (5, 15.0)]
