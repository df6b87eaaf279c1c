"""A training corpus read from trace stores: every trajectory once, the skipped ones counted by reason.

``read_corpus(paths, skip_reason, reasons, key=...)`` reads each store in ``paths`` (run dir, traces dir
or shard), leaves out a traj_id already seen (the same store listed twice: ``duplicate``) and every
trajectory for which ``skip_reason(traj)`` names a reason, and counts ``read``, ``used`` and each reason.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sao_harness.core.errors import UserError
from sao_harness.harness.store import read_traces
from sao_harness.harness.trace import Trajectory


@dataclass
class Corpus:
    trajectories: list[Trajectory]
    counts: dict[str, int] = field(default_factory=dict)  # read, used, and why the others were left out


def read_corpus(paths: list[str | Path], skip_reason: Callable[[Trajectory], str | None], reasons: tuple[str, ...],
                *, key: str) -> Corpus:
    """The trajectories of ``paths`` that ``skip_reason`` keeps; ``key`` (e.g. ``sft.traces``) names the
    config key in the error for a missing or bad store."""
    counts = dict(read=0, used=0, duplicate=0, **{r: 0 for r in reasons})
    seen: set[str] = set()
    kept: list[Trajectory] = []
    for path in paths:
        try:
            stored = read_traces(path)
        except UserError as e:
            raise UserError(f"{key}: {e} (sample trajectories with `sao rollout` first)") from None
        for traj in stored:
            counts["read"] += 1
            reason = "duplicate" if traj.traj_id in seen else skip_reason(traj)
            seen.add(traj.traj_id)
            if reason:
                counts[reason] += 1
            else:
                kept.append(traj)
    counts["used"] = len(kept)
    return Corpus(kept, counts)
