"""The trace format: a trajectory is an ordered list of observation and action segments.

Per token: id, is_action, rollout logprob (actions only), policy version (actions only).
Per trajectory: traj_id, task_id, status, reward, turns, patch, grading result, timings, metadata.

In Parquet a trajectory is one row; the per-token lists are the columns ``token_ids``,
``is_action``, ``logp_rollout`` and ``policy_version`` (null at observation tokens), segment
boundaries are ``segment_kinds`` / ``segment_lengths``, and ``breaks`` lists the token indices where
the proxy had to start a new sequence (the client's history stopped being append-only).

An MoE policy's engine may also give the experts it routed every token to: ``routed_experts``, the bytes
of an int16 C-order array [num_tokens, MoE layers, top_k] (``harness.engines.routes``; -1 where no route
was recorded, e.g. the last token, never fed back), and ``routed_experts_shape`` = [MoE layers, top_k];
both null for a dense model or an engine that gives none. The trainer replays them (trainer.router_replay).
"""
from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from sao_harness.harness.engines.routes import ROUTE_DTYPE

SegmentKind = Literal["observation", "action"]


class Status(StrEnum):
    """How an episode ended (the trace's ``status`` column holds the value)."""

    OK = "ok"  # the agent finished (or stopped on its own): graded, the grade is the reward
    TRUNCATED_TURNS = "truncated_turns"  # out of agent turns: graded as it stands
    TRUNCATED_CONTEXT = "truncated_context"  # over the episode's token budget: graded as it stands
    AGENT_ERROR = "agent_error"  # the agent loop failed on its own (not infrastructure): no reward
    INFRA_ERROR = "infra_error"  # the sandbox, the engine or the grader failed: no reward, ever (never a 0)
    STALE = "stale"  # dropped as sampled by a policy too old to train on: no reward
    PATCH_TOO_LARGE = "patch_too_large"  # the patch is over sandbox.max_patch_bytes: reward 0, not graded
    DISK_EXCEEDED = "disk_exceeded"  # the sandbox went over sandbox.disk_bytes: reward 0, not graded
    PATCH_UNAVAILABLE = "patch_unavailable"  # the running sandbox gave no patch (the agent broke git): reward 0

    def __repr__(self) -> str:
        return repr(self.value)  # logs and messages print 'ok', as when statuses were plain strings


TRUNCATED = frozenset({Status.TRUNCATED_TURNS, Status.TRUNCATED_CONTEXT})  # a limit ended it
GRADED = TRUNCATED | {Status.OK}  # the grader sets the reward
REWARDED = GRADED | {Status.PATCH_TOO_LARGE, Status.DISK_EXCEEDED, Status.PATCH_UNAVAILABLE}  # 0 if not graded
EXCLUDED = frozenset(Status) - REWARDED  # reward always None: never trained, never a 0
INFRA_ERRORS = "infra_errors"  # the name of the count of infra_error trajectories (trainer counters, metrics)
INFRA_KINDS = "infra_kinds"  # the name of the counts of infra errors by kind (trainer counters, checkpoints)
INFRA_KIND = "infra_kind"  # the metadata key of an infra error's kind (harness.infra), next to its reason


class TraceError(ValueError):
    """An invalid trajectory; the message names the trajectory and the field."""


def parse_status(value: str, where: str) -> Status:
    """``value`` as a Status; a TraceError naming ``where`` and the value when it is none."""
    try:
        return Status(value)
    except ValueError:
        raise TraceError(f"{where}: field 'status' is {value!r}, expected one of {', '.join(Status)}") from None


@dataclass
class Segment:
    kind: SegmentKind
    token_ids: list[int]
    logp_rollout: list[float] | None = None  # action segments: the engine's logprob of each token
    policy_version: list[int] | None = None  # action segments: the policy version that sampled it

    def __len__(self) -> int:
        return len(self.token_ids)


@dataclass
class Trajectory:
    task_id: str
    segments: list[Segment] = field(default_factory=list)
    status: Status = Status.OK  # a str value converts (a trace read back); an unknown one is a TraceError
    reward: float | None = None
    turns: int = 0
    patch: str = ""
    grading: dict[str, Any] | None = None
    timings: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    breaks: list[int] = field(default_factory=list)
    traj_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    routed_experts: np.ndarray | None = None  # int16 [num_tokens, MoE layers, top_k], -1 = none (module doc)

    def __post_init__(self) -> None:
        self.status = parse_status(self.status, f"trajectory {self.traj_id} (task {self.task_id})")

    # --- flat per-token views -------------------------------------------------------------
    @property
    def token_ids(self) -> list[int]:
        return [t for s in self.segments for t in s.token_ids]

    @property
    def is_action(self) -> list[bool]:
        return [s.kind == "action" for s in self.segments for _ in s.token_ids]

    @property
    def logp_rollout(self) -> list[float | None]:
        return [x for s in self.segments for x in (s.logp_rollout if s.kind == "action" else [None] * len(s))]

    @property
    def policy_version(self) -> list[int | None]:
        return [x for s in self.segments for x in (s.policy_version if s.kind == "action" else [None] * len(s))]

    @property
    def num_tokens(self) -> int:
        return sum(len(s) for s in self.segments)

    @property
    def num_action_tokens(self) -> int:
        return sum(len(s) for s in self.segments if s.kind == "action")

    @property
    def versions(self) -> list[int]:
        """Sorted distinct policy versions that sampled this trajectory's action tokens."""
        return sorted({v for s in self.segments if s.kind == "action" for v in s.policy_version})

    # --- validation -----------------------------------------------------------------------
    def validate(self) -> Trajectory:
        """Raise TraceError naming the field if this trajectory is malformed; return self."""
        where = f"trajectory {self.traj_id} (task {self.task_id})"
        if not self.traj_id or not isinstance(self.traj_id, str):
            raise TraceError(f"{where}: field 'traj_id' must be a non-empty string")
        if not self.task_id or not isinstance(self.task_id, str):
            raise TraceError(f"{where}: field 'task_id' must be a non-empty string")
        if not isinstance(self.status, Status):
            raise TraceError(f"{where}: field 'status' is {self.status!r}, expected a Status: one of "
                             f"{', '.join(Status)}")
        if self.reward is not None:
            if self.status not in REWARDED:
                raise TraceError(f"{where}: field 'reward' must be null when status is {self.status!r} "
                                 f"(an {self.status} is never a reward)")
            if not isinstance(self.reward, (int, float)) or not math.isfinite(self.reward):
                raise TraceError(f"{where}: field 'reward' must be a finite number, got {self.reward!r}")
        if self.turns < 0:
            raise TraceError(f"{where}: field 'turns' must be >= 0, got {self.turns}")
        for i, s in enumerate(self.segments):
            seg = f"{where}: segment {i} ({s.kind})"
            if s.kind not in ("observation", "action"):
                raise TraceError(f"{seg}: field 'kind' must be 'observation' or 'action'")
            if any((not isinstance(t, int)) or t < 0 for t in s.token_ids):
                raise TraceError(f"{seg}: field 'token_ids' must hold non-negative integers")
            if s.kind == "action":
                if s.logp_rollout is None:
                    raise TraceError(f"{seg}: action tokens without 'logp_rollout'")
                if s.policy_version is None:
                    raise TraceError(f"{seg}: action tokens without 'policy_version'")
                if len(s.logp_rollout) != len(s.token_ids):
                    raise TraceError(f"{seg}: length mismatch: 'logp_rollout' has {len(s.logp_rollout)} "
                                     f"entries for {len(s.token_ids)} tokens")
                if len(s.policy_version) != len(s.token_ids):
                    raise TraceError(f"{seg}: length mismatch: 'policy_version' has {len(s.policy_version)} "
                                     f"entries for {len(s.token_ids)} tokens")
                if any(x is None or not math.isfinite(x) or x > 1e-6 for x in s.logp_rollout):
                    raise TraceError(f"{seg}: field 'logp_rollout' must hold finite log-probabilities (<= 0)")
                if any(v is None or v < 0 for v in s.policy_version):
                    raise TraceError(f"{seg}: field 'policy_version' must hold non-negative integers")
            else:
                if s.logp_rollout is not None or s.policy_version is not None:
                    raise TraceError(f"{seg}: observation tokens must not carry 'logp_rollout' or 'policy_version'")
        n = self.num_tokens
        for b in self.breaks:
            if not 0 < b < n:
                raise TraceError(f"{where}: field 'breaks' holds {b}, outside the token range (0, {n})")
        routes = self.routed_experts
        if routes is not None:
            if not isinstance(routes, np.ndarray) or routes.dtype != ROUTE_DTYPE or routes.ndim != 3:
                raise TraceError(f"{where}: field 'routed_experts' must be an int16 array [tokens, MoE layers, "
                                 f"top_k], got {type(routes).__name__} {getattr(routes, 'dtype', '')}"
                                 f"{list(getattr(routes, 'shape', []))}")
            if routes.shape[0] != n:
                raise TraceError(f"{where}: length mismatch: 'routed_experts' has {routes.shape[0]} rows for {n} "
                                 "tokens")
        return self

    # --- Parquet rows ---------------------------------------------------------------------
    def to_row(self) -> dict[str, Any]:
        return {
            "traj_id": self.traj_id,
            "task_id": self.task_id,
            "status": self.status,
            "reward": None if self.reward is None else float(self.reward),
            "turns": int(self.turns),
            "num_tokens": self.num_tokens,
            "num_action_tokens": self.num_action_tokens,
            "token_ids": self.token_ids,
            "is_action": self.is_action,
            "logp_rollout": self.logp_rollout,
            "policy_version": self.policy_version,
            "segment_kinds": [s.kind for s in self.segments],
            "segment_lengths": [len(s) for s in self.segments],
            "breaks": list(self.breaks),
            "patch": self.patch,
            "grading": json.dumps(self.grading) if self.grading is not None else None,
            "timings": json.dumps(self.timings),
            "metadata": json.dumps(self.metadata),
            "routed_experts": None if self.routed_experts is None else np.ascontiguousarray(
                self.routed_experts).astype("<i2", copy=False).tobytes(),
            "routed_experts_shape": None if self.routed_experts is None else list(self.routed_experts.shape[1:]),
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Trajectory:
        where = f"trace row {row.get('traj_id', '?')}"
        for col in ("token_ids", "is_action", "logp_rollout", "policy_version", "segment_kinds", "segment_lengths"):
            if row.get(col) is None:
                raise TraceError(f"{where}: missing column '{col}'")
        n = len(row["token_ids"])
        for col in ("is_action", "logp_rollout", "policy_version"):
            if len(row[col]) != n:
                raise TraceError(f"{where}: length mismatch: '{col}' has {len(row[col])} entries for {n} tokens")
        if sum(row["segment_lengths"]) != n:
            raise TraceError(f"{where}: length mismatch: 'segment_lengths' sum to {sum(row['segment_lengths'])}, "
                             f"not {n} tokens")
        segments, pos = [], 0
        for kind, length in zip(row["segment_kinds"], row["segment_lengths"]):
            sl = slice(pos, pos + length)
            flags = row["is_action"][sl]
            if any(f != (kind == "action") for f in flags):
                raise TraceError(f"{where}: 'is_action' disagrees with segment kind {kind!r} "
                                 f"at tokens {pos}..{pos + length}")
            if kind == "action":
                segments.append(Segment("action", list(row["token_ids"][sl]), list(row["logp_rollout"][sl]),
                                        list(row["policy_version"][sl])))
            else:
                segments.append(Segment("observation", list(row["token_ids"][sl])))
            pos += length
        return cls(
            traj_id=row["traj_id"], task_id=row["task_id"], segments=segments, status=row["status"],
            reward=row.get("reward"), turns=row.get("turns") or 0, patch=row.get("patch") or "",
            grading=json.loads(row["grading"]) if row.get("grading") else None,
            timings=json.loads(row.get("timings") or "{}"), metadata=json.loads(row.get("metadata") or "{}"),
            breaks=list(row.get("breaks") or []), routed_experts=_routes_from_row(row, where, n),
        ).validate()


def _routes_from_row(row: dict[str, Any], where: str, n: int) -> np.ndarray | None:
    """The row's routed experts as int16 [n, layers, top_k], or None (columns null or absent: older traces)."""
    data, shape = row.get("routed_experts"), row.get("routed_experts_shape")
    if data is None:
        return None
    if not shape or len(shape) != 2 or len(data) != 2 * n * shape[0] * shape[1]:
        raise TraceError(f"{where}: column 'routed_experts' holds {len(data)} bytes, not int16 [{n} tokens, "
                         f"{shape} (routed_experts_shape)]")
    return np.frombuffer(data, dtype="<i2").astype(ROUTE_DTYPE).reshape(n, *shape)


SCHEMA = pa.schema([
    ("traj_id", pa.string()),
    ("task_id", pa.string()),
    ("status", pa.string()),
    ("reward", pa.float64()),
    ("turns", pa.int32()),
    ("num_tokens", pa.int64()),
    ("num_action_tokens", pa.int64()),
    ("token_ids", pa.list_(pa.int32())),
    ("is_action", pa.list_(pa.bool_())),
    ("logp_rollout", pa.list_(pa.float32())),
    ("policy_version", pa.list_(pa.int32())),
    ("segment_kinds", pa.list_(pa.string())),
    ("segment_lengths", pa.list_(pa.int32())),
    ("breaks", pa.list_(pa.int32())),
    ("patch", pa.string()),
    ("grading", pa.string()),  # JSON
    ("timings", pa.string()),  # JSON
    ("metadata", pa.string()),  # JSON
    ("routed_experts", pa.large_binary()),  # int16 [num_tokens, MoE layers, top_k], C order (module doc)
    ("routed_experts_shape", pa.list_(pa.int32())),  # [MoE layers, top_k]
])


def to_table(trajectories: list[Trajectory]) -> pa.Table:
    rows = [t.validate().to_row() for t in trajectories]
    return pa.Table.from_pylist(rows, schema=SCHEMA)
