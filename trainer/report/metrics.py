"""Per-step metrics of a run: one JSON line per step in ``<run>/metrics.jsonl``, TensorBoard in ``<run>/tb``.

Contract of the JSONL file (the durable record; TensorBoard is a view of it):
- one object per line: ``{"step": int, "time": unix seconds, "<metric>": float | null, ...}``; a
  non-finite value (nan, inf: e.g. explained variance of a batch whose returns are all equal) is
  written as ``null``, so every line is strict JSON;
- each line is flushed and fsynced before ``log`` returns, so a kill loses at most the line being
  written. Opening a file whose last line was torn starts on a fresh line, so the torn fragment never
  swallows the next record;
- ``read_metrics`` skips torn / unparsable lines, and a step logged again (a run resumed from an
  older checkpoint) supersedes the records at and after it: the result has increasing steps. One
  record per step. TensorBoard does the same (``purge_step`` at the first step a resumed logger logs).

Names: every metric is ``<family>/<name>``, the family one of ``FAMILIES`` (TensorBoard groups the
scalars by it, `sao runs plot` draws one figure per family); docs/algorithm.md section 7 lists them.
"""
from __future__ import annotations

import json
import math
import os
import time
import warnings
from pathlib import Path

METRICS_FILE = "metrics.jsonl"
TB_DIR = "tb"
RESERVED = ("step", "time")
# the families, in display order
FAMILIES = {
    "loss": "the losses the two optimizers minimise",
    "critic": "the value function: explained variance, values, returns, gradient norm, learning rate",
    "policy": "the policy step: ratios, DIS masking / PPO clipping, entropy, advantages, gradient norm",
    "rollout": "the trajectories behind a step: reward, turns, tokens, truncation, infra errors (share, kinds), "
               "staleness",
    "perf": "throughput and utilisation: trajectories per hour, tokens per second, idle fractions",
    "time": "seconds per phase of a step (and progress counters)",
}
# the console line's metrics (those a step logged), with their format
CONSOLE = {"policy/version": ".0f", "rollout/reward_mean": ".3f", "critic/explained_variance": ".3f",
           "policy/dis_masked": ".2%", "policy/clip_frac": ".2%", "rollout/staleness_mean": ".2f",
           "perf/trajectories_per_hour": ".1f", "perf/engine_idle_frac": ".0%"}


def family(key: str) -> str | None:
    """The family of a metric name (``"critic/grad_norm"`` -> ``"critic"``), None if it has none."""
    head, sep, _ = key.partition("/")
    return head if sep and head in FAMILIES else None


def _after_second(second: int) -> None:
    """Wait until the wall clock is past ``second``. An event file is named ``events.out.tfevents.<second,
    10 digits>.<host>.<pid>.<counter>``: two files of one process in one second sort by the counter as text
    (``10`` before ``9``), so a resumed run's file must start in a later second than the files before it."""
    while time.time() < second + 1:
        time.sleep(0.05)


class MetricsLogger:
    """``MetricsLogger(run_dir).log(step, {"rollout/reward_mean": 0.5, ...})``; ``close()`` at the end."""

    def __init__(self, run_dir: str | Path, tensorboard: bool = True):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        self._file = open(self.path, "ab")
        if self._file.tell() > 0:  # a kill may have left a torn last line: never append onto it
            with open(self.path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    self._file.write(b"\n")
        self.tensorboard = tensorboard
        self._tb = None  # opened at the first log(), to purge what a resumed run logs again

    def log(self, step: int, metrics: dict[str, float]) -> dict:
        """Append one record for `step` (JSONL line, fsynced; TensorBoard scalars); return the record."""
        if self._file is None:
            raise ValueError("MetricsLogger.log after close()")
        record: dict = {"step": int(step), "time": time.time()}
        for key, value in metrics.items():
            if key in RESERVED:
                raise ValueError(f"metric name {key!r} is reserved (every record has 'step' and 'time')")
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise ValueError(f"metric {key!r} must be a number, got {value!r}") from None
            record[key] = value if math.isfinite(value) else None
        self._file.write((json.dumps(record, allow_nan=False) + "\n").encode())
        self._file.flush()
        os.fsync(self._file.fileno())
        if self.tensorboard and self._tb is None:
            from torch.utils.tensorboard import SummaryWriter  # lazy: tensorboard is heavy and optional

            tb_dir = self.run_dir / TB_DIR
            earlier = sorted(tb_dir.glob("events.out.tfevents.*")) if tb_dir.is_dir() else []
            if earlier:  # TensorBoard reads the files in name order: this one must sort after them
                _after_second(max(int(f.name.split(".")[3]) for f in earlier))
            # purge_step: TensorBoard hides the earlier files' events at steps >= the first one logged now
            self._tb = SummaryWriter(log_dir=str(tb_dir), purge_step=record["step"] if earlier else None)
        if self._tb is not None:
            for key, value in record.items():
                if key not in RESERVED and value is not None:
                    self._tb.add_scalar(key, value, global_step=record["step"], walltime=record["time"])
            self._tb.flush()
        return record

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        self.tensorboard = False

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The records of ``<run_dir>/metrics.jsonl`` (or of that file itself), in increasing step order.

    A missing file is an empty list. Unparsable lines are skipped (a torn last line silently, others
    with a warning); a step that goes back (resumed run) drops the earlier records at and after it.
    """
    path = Path(run_dir)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.is_file():
        return []
    lines = path.read_bytes().split(b"\n")
    records: list[dict] = []
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
            if not isinstance(rec, dict) or not isinstance(rec.get("step"), int):
                raise ValueError("not a record with an integer 'step'")
        except ValueError:
            if i < len(lines) - 1:  # the last element is a line without its newline: torn, expected
                warnings.warn(f"{path}: skipping unreadable line {i + 1}", stacklevel=2)
            continue
        while records and records[-1]["step"] >= rec["step"]:
            records.pop()
        records.append(rec)
    return records


def progress_line(step: int, metrics: dict[str, float]) -> str:
    """One compact console line: the step and the ``CONSOLE`` metrics it logged ("-": nan / inf), e.g.
    ``step 12 | rollout/reward_mean 0.530 | critic/explained_variance 0.210 | policy/dis_masked 0.60% | ...``."""
    parts = [f"step {step}"]
    for key, spec in CONSOLE.items():
        if key in metrics:
            value = metrics[key]
            parts.append(f"{key} {format(value, spec) if value is not None and math.isfinite(value) else '-'}")
    return " | ".join(parts)
