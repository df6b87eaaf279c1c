"""The trace store as the trainer's queue: trajectories not consumed yet, and how a batch is taken.

- `TraceQueue`: shards not seen yet, trajectories not consumed yet, in stream (shard-name) order.
  Consumed = trained, or excluded and counted: an unrewarded trajectory (infra_error, agent_error)
  never enters a batch; neither does one more than `max_staleness` versions older than the policy
  (counted from its oldest token, `docs/algorithm.md`).
- `take_async` (SAO): a batch is the first B usable trajectories, taken the moment B are there.
- `take_round` (the sync baseline): a round's rewarded trajectories, once all of it has finished.
- `infra_frac` / `over_infra_limit`: the run's share of infra errors among the trajectories consumed
  (every attempt is stored and consumed, a retried one too), and the `rollout.max_infra_frac` stop rule.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

from sao_harness.harness.infra import OTHER, kind_of, min_episodes, over_max_infra_frac
from sao_harness.harness.store import TraceStore, read_shard
from sao_harness.harness.trace import INFRA_ERRORS, INFRA_KINDS, Status, Trajectory


@dataclass
class Entry:
    """A finished trajectory in the store, not consumed yet (the heavy columns stay on disk)."""

    traj_id: str
    shard: Path
    status: Status
    reward: float | None
    min_version: int | None  # the policy version of its oldest token (None: no action token)
    round: str | None  # sync mode: the round it belongs to
    last_attempt: bool  # False: an infra error that was retried
    error: str | None = None  # an infra error's reason
    kind: str | None = None  # an infra error's kind (harness.infra.KINDS)


class TraceQueue:
    """Trajectories in the trace store that are not consumed yet, in stream (shard-name) order.

    `consumed` is the position in the stream: the traj ids consumed so far, in order (a checkpoint
    saves it). Every shard is read once, when it first appears; a shard is complete when it appears
    (the store renames it into place).
    """

    def __init__(self, store: TraceStore, consumed: list[str]):
        self.store = store
        self.consumed: list[str] = list(consumed)
        self._consumed = set(consumed)
        self._seen: set[str] = set()
        self.pending: dict[str, Entry] = {}

    def poll(self) -> int:
        """Read the shards that appeared since the last poll; return how many trajectories are new."""
        new = 0
        for shard in self.store.shards():
            if shard.name in self._seen:
                continue
            table = pq.read_table(shard, columns=["traj_id", "status", "reward", "policy_version", "metadata"])
            rows = table.select(["traj_id", "status", "reward", "metadata"]).to_pylist()
            for i, row in enumerate(rows):
                tid = row["traj_id"]
                if tid in self._consumed or tid in self.pending:
                    continue
                meta = json.loads(row["metadata"] or "{}")
                low = pc.min(table.column("policy_version")[i].values).as_py()
                status = Status(row["status"])
                self.pending[tid] = Entry(tid, shard, status, row["reward"], low, meta.get("round"),
                                          meta.get("last_attempt", True), meta.get(Status.INFRA_ERROR),
                                          kind_of(meta) if status == Status.INFRA_ERROR else None)
                new += 1
            self._seen.add(shard.name)
        return new

    def state_dict(self) -> dict:
        """What a checkpoint keeps of the queue: the ids consumed so far (resumed: `TraceQueue(store, consumed)`)."""
        return {"consumed": list(self.consumed)}

    def consume(self, entries: list[Entry]) -> None:
        for e in entries:
            del self.pending[e.traj_id]
            self.consumed.append(e.traj_id)
            self._consumed.add(e.traj_id)

    def load(self, entries: list[Entry]) -> list[Trajectory]:
        """The full trajectories of `entries`, in that order."""
        by_shard: dict[Path, dict] = {}
        for e in entries:
            if e.shard not in by_shard:
                by_shard[e.shard] = {t.traj_id: t for t in read_shard(e.shard)}
        return [by_shard[e.shard][e.traj_id] for e in entries]


@dataclass
class Counters:
    """Cumulative counts of the run (saved in checkpoints)."""

    trained: int = 0
    excluded_unrewarded: int = 0  # infra_error, agent_error: never trained, never a 0
    infra_errors: int = 0
    infra_kinds: dict = field(default_factory=dict)  # harness.infra kind -> infra errors of it
    dropped_stale: int = 0
    worker_deaths: int = 0
    engine_deaths: int = 0  # engine replicas that died and were replaced
    step_counts: dict = field(default_factory=dict)  # this step's excluded / infra / stale (not saved)
    infra_streak: int = 0  # infra errors since the last usable trajectory (not saved)
    last_infra_error: str | None = None

    def count(self, key: str, n: int = 1) -> None:
        setattr(self, key, getattr(self, key) + n)
        self.step_counts[key] = self.step_counts.get(key, 0) + n

    def state_dict(self) -> dict:
        """The counts a checkpoint keeps (resumed: `Counters(**state)`)."""
        return {k: getattr(self, k) for k in ("trained", "excluded_unrewarded", INFRA_ERRORS, INFRA_KINDS,
                                                "dropped_stale", "worker_deaths", "engine_deaths")}


def drop(queue: TraceQueue, counters: Counters, entries: list[Entry], why: str) -> None:
    """Consume `entries` without training them; count them as `why` ("stale" or "unrewarded")."""
    queue.consume(entries)
    for e in entries:
        if why == "stale":
            counters.count("dropped_stale")
        else:
            counters.count("excluded_unrewarded")
            if e.status == Status.INFRA_ERROR:
                counters.count(INFRA_ERRORS)
                kind = e.kind or OTHER
                counters.infra_kinds[kind] = counters.infra_kinds.get(kind, 0) + 1
                counters.infra_streak += 1
                counters.last_infra_error = e.error


def take_async(queue: TraceQueue, counters: Counters, batch_size: int, version: int,
               max_staleness: int) -> list[Entry] | None:
    """The first `batch_size` usable trajectories (consumed), or None; drops the unusable ones on the way.

    Usable: rewarded, and `version - min_version <= max_staleness` (min_version: its oldest token's).
    """
    usable = []
    for e in list(queue.pending.values()):
        if e.reward is None:
            drop(queue, counters, [e], "unrewarded")
        elif e.min_version is not None and version - e.min_version > max_staleness:
            drop(queue, counters, [e], "stale")
        else:
            usable.append(e)
    if usable:
        counters.infra_streak = 0
    if len(usable) < batch_size:
        return None
    batch = usable[:batch_size]
    queue.consume(batch)
    return batch


def take_round(queue: TraceQueue, counters: Counters, round_id: str, round_size: int) -> list[Entry] | None:
    """Sync mode: once every assignment of `round_id` has finished, its rewarded trajectories (consumed)."""
    mine = [e for e in queue.pending.values() if e.round == round_id]
    retried = [e for e in mine if not e.last_attempt]
    if retried:
        drop(queue, counters, retried, "unrewarded")
    final = [e for e in mine if e.last_attempt]
    if len(final) < round_size:
        return None
    drop(queue, counters, [e for e in final if e.reward is None], "unrewarded")
    batch = [e for e in final if e.reward is not None]
    if batch:
        counters.infra_streak = 0
    queue.consume(batch)
    return batch


def infra_frac(queue: TraceQueue, counters: Counters) -> float:
    """Infra errors / trajectories consumed, over the run so far (`rollout/infra_frac`); 0 before the first."""
    return counters.infra_errors / max(len(queue.consumed), 1)


def over_infra_limit(queue: TraceQueue, counters: Counters, max_frac: float | None, batch_size: int) -> str | None:
    """Why the run must stop (`rollout.max_infra_frac`, checked from `min_episodes(batch_size)` consumed), or None."""
    return over_max_infra_frac(counters.infra_errors, len(queue.consumed), counters.infra_kinds, max_frac,
                               min_episodes(batch_size), counters.last_infra_error)
