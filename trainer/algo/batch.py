"""Trajectories (harness.trace) -> padded [B, T] tensors, and packed token-budget micro-batches.

One trajectory is one row, right-padded: the layout of GAE, advantages and metrics (per row, on CPU).
The model passes run on packed micro-batches instead (`micro_batches`, `pack`): whole rows laid end
to end in one [1, L] sequence with no padding, position ids restarting at 0 at each row's first
token, attention kept inside each row (docs/algorithm.md section 4.7).

The terminal reward sits on the row's last action token (docs/algorithm.md section 3.1); a
trajectory without action tokens is an empty row (it trains nothing).
Rejected with ValueError, naming the trajectory:
  - a trajectory without a reward (status infra_error, agent_error, stale ...): filter those out and
    count them before building a batch; they are never trained on as 0;
  - a trajectory with `breaks` (the proxy restarted the token sequence): its pieces are different
    contexts, so it is not one row, and split into rows its earlier pieces would get wrong credit
    (trainer.algo.sao's module doc); `SAOTrainer.update` skips and counts such trajectories
    (`rollout/break_frac`) before building a batch;
  - an action token at position 0 (nothing to predict it from).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from sao_harness.harness.trace import Trajectory


@dataclass
class TrajectoryBatch:
    input_ids: torch.Tensor  # [B, T] long, pad_token_id at padding
    attention_mask: torch.Tensor  # [B, T] bool, True at real tokens
    action_mask: torch.Tensor  # [B, T] bool, True at action tokens
    logp_rollout: torch.Tensor  # [B, T] fp32, the engine's logprob at action tokens, 0 elsewhere
    policy_version: torch.Tensor  # [B, T] long, the sampling policy version at action tokens, -1 elsewhere
    rewards: torch.Tensor  # [B, T] fp32, the trajectory's reward on its last action token, 0 elsewhere
    reward: torch.Tensor  # [B] fp32, the trajectory's reward
    num_action_tokens: torch.Tensor  # [B] long
    task_ids: list[str]
    traj_ids: list[str]
    statuses: list[str]
    turns: list[int]
    routes: list  # per row: the engine's routed experts, int16 numpy [n, MoE layers, top_k], or None

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device: torch.device | str) -> TrajectoryBatch:
        """The same batch with its tensors on ``device`` (the model's)."""
        return TrajectoryBatch(**{f.name: getattr(self, f.name) if isinstance(getattr(self, f.name), list)
                                  else getattr(self, f.name).to(device) for f in fields(self)})

    def select(self, rows: list[int]) -> TrajectoryBatch:
        """The sub-batch of `rows`, with padding trimmed to its longest row."""
        index = torch.tensor(rows, dtype=torch.long)
        width = int(self.attention_mask[index].sum(1).max()) if rows else 0
        parts = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, list):
                parts[f.name] = [value[i] for i in rows]
            elif value.dim() == 2:
                parts[f.name] = value[index, :width]
            else:
                parts[f.name] = value[index]
        return TrajectoryBatch(**parts)


def build_batch(trajectories: list[Trajectory], pad_token_id: int = 0) -> TrajectoryBatch:
    """Validate the trajectories and pack them into right-padded tensors (see the module docstring)."""
    if not trajectories:
        raise ValueError("trajectories: an empty list, nothing to train on")
    for traj in trajectories:
        traj.validate()
        where = f"trajectory {traj.traj_id} (task {traj.task_id})"
        if traj.reward is None:
            raise ValueError(f"{where}: reward is None (status {traj.status!r}); exclude and count such "
                             "trajectories before training, never train on them as 0")
        if traj.breaks:
            raise ValueError(f"{where}: has breaks at tokens {traj.breaks} (the token sequence restarted); "
                             "such a trajectory is not one sequence and cannot be trained as one row")
        if traj.num_tokens and traj.is_action[0]:
            raise ValueError(f"{where}: starts with an action token, which has no context to be predicted from")

    batch_size = len(trajectories)
    width = max(1, max(t.num_tokens for t in trajectories))
    input_ids = torch.full((batch_size, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(batch_size, width, dtype=torch.bool)
    action_mask = torch.zeros(batch_size, width, dtype=torch.bool)
    logp_rollout = torch.zeros(batch_size, width, dtype=torch.float32)
    policy_version = torch.full((batch_size, width), -1, dtype=torch.long)
    rewards = torch.zeros(batch_size, width, dtype=torch.float32)
    for row, traj in enumerate(trajectories):
        n = traj.num_tokens
        input_ids[row, :n] = torch.tensor(traj.token_ids, dtype=torch.long)
        attention_mask[row, :n] = True
        is_action = torch.tensor(traj.is_action, dtype=torch.bool)
        action_mask[row, :n] = is_action
        logp_rollout[row, :n] = torch.tensor([0.0 if x is None else x for x in traj.logp_rollout])
        policy_version[row, :n] = torch.tensor([-1 if v is None else v for v in traj.policy_version])
        if is_action.any():
            rewards[row, int(is_action.nonzero()[-1])] = float(traj.reward)
    return TrajectoryBatch(
        input_ids=input_ids, attention_mask=attention_mask, action_mask=action_mask,
        logp_rollout=logp_rollout, policy_version=policy_version, rewards=rewards,
        reward=torch.tensor([float(t.reward) for t in trajectories], dtype=torch.float32),
        num_action_tokens=action_mask.sum(1),
        task_ids=[t.task_id for t in trajectories], traj_ids=[t.traj_id for t in trajectories],
        statuses=[t.status for t in trajectories], turns=[t.turns for t in trajectories],
        routes=[t.routed_experts for t in trajectories],
    )


def pack_groups(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Indices of `lengths` in groups of at most max_tokens tokens in total (bin packing).

    First-fit decreasing: longest first (ties in index order), each into the first group with room.
    A length over max_tokens is a group of its own (a trajectory cannot be split: it is one
    sequence); a length 0 is in no group (nothing to compute).
    """
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be > 0, got {max_tokens}")
    groups: list[list[int]] = []
    used: list[int] = []
    for i in sorted((i for i, n in enumerate(lengths) if n), key=lambda i: -lengths[i]):  # stable sort
        room = next((g for g, n in enumerate(used) if n + lengths[i] <= max_tokens), None)
        if room is None:
            groups.append([i])
            used.append(lengths[i])
        else:
            groups[room].append(i)
            used[room] += lengths[i]
    return groups


def micro_batches(batch: TrajectoryBatch, max_tokens: int, rows: list[int] | None = None) -> list[list[int]]:
    """The rows `rows` (default: all) of `batch` in packed micro-batches of at most max_tokens real
    tokens, no padding (`pack_groups` of the rows' lengths; `pack` lays a group out)."""
    lengths = batch.attention_mask.sum(1).tolist()
    rows = list(range(len(lengths))) if rows is None else rows
    return [[rows[i] for i in g] for g in pack_groups([lengths[r] for r in rows], max_tokens)]


@dataclass
class PackedRows:
    """Rows of a TrajectoryBatch laid end to end: one sequence [1, L], L = their real tokens.

    position_ids count 0..n_i-1 inside each row i, so a model called with position_ids and no
    attention mask keeps attention inside each row (transformers' padding-free path: SDPA / eager
    build the block-diagonal causal mask from the position ids, flash_attention_2 runs varlen on
    them). Packed token j is token cols[j] of batch row batch_rows[j]: `gather` reads a [B, T]
    tensor at the packed tokens, `scatter` writes packed values back into one.
    """
    rows: list[int]
    input_ids: torch.Tensor  # [1, L] long
    position_ids: torch.Tensor  # [1, L] long, 0 at each row's first token
    action_mask: torch.Tensor  # [1, L] bool
    logp_rollout: torch.Tensor  # [1, L] fp32
    batch_rows: torch.Tensor  # [L] long (CPU): the batch row of each packed token
    cols: torch.Tensor  # [L] long (CPU): its position in that row
    routes: torch.Tensor | None = None  # [L, MoE layers, top_k] int16, -1 = none; None: no row has routes

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[1]

    def to(self, device: torch.device | str) -> PackedRows:
        """The model inputs on `device`; the index into the batch stays on the CPU, where the batch is."""
        return PackedRows(self.rows, self.input_ids.to(device), self.position_ids.to(device),
                          self.action_mask.to(device), self.logp_rollout.to(device), self.batch_rows, self.cols,
                          None if self.routes is None else self.routes.to(device))

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T] (a per-row tensor of the batch) at the packed tokens -> [1, L], on input_ids' device."""
        return x[self.batch_rows, self.cols][None].to(self.input_ids.device)

    def scatter(self, y: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Write packed values y [1, L] into out [B, T] at their rows and positions; returns out."""
        out[self.batch_rows, self.cols] = y[0].detach().to(out.device, out.dtype)
        return out


def pack(batch: TrajectoryBatch, rows: list[int]) -> PackedRows:
    """The rows `rows` of `batch` (a group of `micro_batches`), packed end to end (PackedRows)."""
    if not rows:
        raise ValueError("rows: an empty group, nothing to pack")
    lengths = batch.attention_mask[rows].sum(1).tolist()
    batch_rows = torch.repeat_interleave(torch.tensor(rows, dtype=torch.long), torch.tensor(lengths))
    cols = torch.cat([torch.arange(n) for n in lengths])
    return PackedRows(rows=list(rows), input_ids=batch.input_ids[batch_rows, cols][None],
                      position_ids=cols[None].clone(), action_mask=batch.action_mask[batch_rows, cols][None],
                      logp_rollout=batch.logp_rollout[batch_rows, cols][None], batch_rows=batch_rows, cols=cols,
                      routes=_packed_routes([batch.routes[r] for r in rows], lengths))


def _packed_routes(routes: list, lengths: list[int]) -> torch.Tensor | None:
    """The rows' routes end to end [L, layers, top_k] (-1 rows for a row without), or None if none has any."""
    shape = next((r.shape[1:] for r in routes if r is not None), None)
    if shape is None:
        return None
    parts = [torch.full((n, *shape), -1, dtype=torch.int16) if r is None else torch.from_numpy(r[:n].copy())
             for r, n in zip(routes, lengths)]
    return torch.cat(parts)


def minibatches(num_rows: int, n: int) -> list[list[int]]:
    """Rows 0..num_rows-1 in `n` contiguous near-equal slices (the first num_rows % n one row longer);
    empty slices are dropped (n > num_rows)."""
    if n <= 0:
        raise ValueError(f"n must be > 0, got {n}")
    size, extra = divmod(num_rows, n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (i < extra)
        if end > start:
            out.append(list(range(start, end)))
        start = end
    return out
