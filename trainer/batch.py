"""Trajectories (harness.trace) -> padded [B, T] tensors, and token-budget micro-batches.

One trajectory is one row, right-padded. The terminal reward sits on the row's last action token
(docs/algorithm.md section 3.1); a trajectory without action tokens is an empty row (it trains nothing).
Rejected with ValueError, naming the trajectory:
  - a trajectory without a reward (status infra_error, agent_error, stale ...): filter those out and
    count them before building a batch; they are never trained on as 0;
  - a trajectory with `breaks` (the proxy restarted the token sequence): its pieces are different
    contexts, so it is not one row, and split into rows its earlier pieces would get wrong credit
    (trainer.sao's module doc); `SAOTrainer.update` skips and counts such trajectories
    (`rollout/break_frac`) before building a batch;
  - an action token at position 0 (nothing to predict it from).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from harness.trace import Trajectory


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
    )


def micro_batches(batch: TrajectoryBatch, max_tokens: int) -> list[list[int]]:
    """Group rows so each group's padded size (rows x longest row) stays <= max_tokens.

    Rows are taken shortest first, so rows of similar length share a group (little padding). A row
    longer than max_tokens is a group of its own (it cannot be split: it is one sequence).
    """
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be > 0, got {max_tokens}")
    lengths = batch.attention_mask.sum(1).tolist()
    groups, current, longest = [], [], 0
    for row in sorted(range(len(lengths)), key=lambda r: lengths[r]):
        length = lengths[row]
        if current and (len(current) + 1) * max(longest, length) > max_tokens:
            groups.append(current)
            current, longest = [], 0
        current.append(row)
        longest = max(longest, length)
    if current:
        groups.append(current)
    return groups


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
