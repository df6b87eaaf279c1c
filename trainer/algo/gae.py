"""Generalised advantage estimation for agent trajectories (docs/algorithm.md section 3).

Observation-skipping GAE indexes only the action tokens k = 1..K of a trajectory, concatenated over
turns, with V_k the critic's value at action token k:

    delta_k = r_k + gamma * V_{k+1} - V_k,      V_{K+1} = 0
    A_k     = delta_k + gamma * lambda * A_{k+1}
    G_k     = A_k + V_k                         (the critic's target)

At a turn boundary V_{k+1} is the value at the first token of the next action: the observation in
between is skipped, not discounted through. Implementation: gather the action tokens of every row,
left-aligned into a [B, K_max] tensor ("compaction"), run ordinary GAE on it, scatter back.

With a constant discount c = gamma * lambda per row, A is a discounted reverse cumulative sum of
delta, A_k = sum_{j>=k} c^(j-k) delta_j; `discounted_reverse_cumsum` runs the recursion as a
two-level scan (inside blocks of ~sqrt(K) positions, then across blocks), vectorised over rows and
blocks, so K = 32k tokens cost ~2 * 180 small batched steps, not 32k. All in fp32.
`gae_reference` is the same estimator as a plain per-token loop, to read and to test against.
"""
from __future__ import annotations

import math

import torch


def length_adaptive_lambda(num_action_tokens, alpha: float = 1.5) -> torch.Tensor:
    """lambda_p = 1 - 1/(alpha * l) per trajectory, l = its number of action tokens.

    Clamped to [0, 1]; a trajectory without action tokens gets 0 (it has nothing to estimate).
    """
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    lengths = torch.as_tensor(num_action_tokens, dtype=torch.float32)
    if lengths.dim() != 1:
        raise ValueError(f"num_action_tokens must be one count per trajectory (1-D), got shape {tuple(lengths.shape)}")
    if (lengths < 0).any():
        raise ValueError("num_action_tokens must be >= 0")
    lam = 1.0 - 1.0 / (alpha * lengths.clamp(min=1.0))
    return torch.where(lengths > 0, lam, torch.zeros_like(lam)).clamp(0.0, 1.0)


def gae_reference(values, rewards, mask, gamma: float, lam: float) -> tuple[list[float], list[float]]:
    """The readable definition (docs/algorithm.md section 3), one row of plain Python floats.

    Walk backwards, remembering the value and advantage of the next masked position, so unmasked
    positions (observations, padding) are skipped, not discounted through. -> (advantages, returns),
    0 outside mask. The fast functions below must agree with it (tests/trainer/test_gae.py).
    """
    n = len(values)
    adv, ret = [0.0] * n, [0.0] * n
    next_value, next_adv = 0.0, 0.0  # V_{K+1} = 0, A_{K+1} = 0
    for t in reversed(range(n)):
        if not mask[t]:
            continue
        delta = rewards[t] + gamma * next_value - values[t]
        adv[t] = delta + gamma * lam * next_adv
        ret[t] = adv[t] + values[t]
        next_value, next_adv = values[t], adv[t]
    return adv, ret


def _reverse_scan(steps: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """y_k = x_k + c * y_{k+1} by a loop over the first dim of steps [n, ...], vectorised over the rest."""
    acc = torch.zeros_like(steps[0])
    out = [acc] * steps.shape[0]
    for k in range(steps.shape[0] - 1, -1, -1):
        acc = torch.addcmul(steps[k], c, acc)
        out[k] = acc
    return torch.stack(out)


def discounted_reverse_cumsum(x: torch.Tensor, discount: torch.Tensor) -> torch.Tensor:
    """y_k = x_k + c * y_{k+1} (y past the end = 0) along dim 1, one discount c in [0, 1] per row.

    Two-level scan, O(sqrt(L)) vectorised steps instead of L: cut each row into blocks of
    S ~ sqrt(L) positions and run the recursion inside all blocks at once with zero carry-in
    (local). The value entering block n from the right, Y_{n+1} (y at the next block's first
    position), obeys Y_n = local_{n,0} + c^S * Y_{n+1}: the same recursion over the block starts.
    Then y_{n,i} = local_{n,i} + c^(S-i) * Y_{n+1}. All powers of c are <= 1.
    """
    batch, length = x.shape
    if length == 0:
        return x.clone()
    block = math.isqrt(length - 1) + 1  # S >= sqrt(L)
    num_blocks = -(-length // block)
    xb = torch.nn.functional.pad(x, (0, num_blocks * block - length)).view(batch, num_blocks, block)
    c = discount.to(x.dtype).view(batch, 1)
    local = _reverse_scan(xb.permute(2, 0, 1).contiguous(), c)  # [S, B, blocks]
    starts = _reverse_scan(local[0].T, c.view(batch) ** block)  # Y_n, [blocks, B]
    carry = torch.nn.functional.pad(starts[1:], (0, 0, 0, 1)).T  # Y_{n+1}, 0 after the last block, [B, blocks]
    decay = c.view(1, batch, 1) ** (block - torch.arange(block, device=x.device, dtype=x.dtype)).view(block, 1, 1)
    y = local + decay * carry[None]  # [S, B, blocks]
    return y.permute(1, 2, 0).reshape(batch, num_blocks * block)[:, :length]


def _check_inputs(values, rewards, mask, mask_name, gamma, lam):
    if values.dim() != 2:
        raise ValueError(f"values must have shape [B, T], got {tuple(values.shape)}")
    if rewards.shape != values.shape or mask.shape != values.shape:
        raise ValueError(f"values {tuple(values.shape)}, rewards {tuple(rewards.shape)} and {mask_name} "
                         f"{tuple(mask.shape)} must have the same shape [B, T]")
    if mask.dtype != torch.bool:
        raise ValueError(f"{mask_name} must be a bool tensor, got {mask.dtype}")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    lam = torch.as_tensor(lam, dtype=torch.float32, device=values.device)
    if lam.dim() == 0:
        lam = lam.expand(values.shape[0])
    if lam.shape != (values.shape[0],):
        raise ValueError(f"lam must be a float or a tensor of shape [B] = [{values.shape[0]}], got {tuple(lam.shape)}")
    if ((lam < 0) | (lam > 1)).any():
        raise ValueError("lam must lie in [0, 1]")
    return lam


def _reject_rewards_outside(rewards, mask, mask_name):
    row, pos = (rewards.ne(0) & ~mask).nonzero()[0].tolist()
    raise ValueError(f"rewards: nonzero reward at row {row}, position {pos}, which is outside {mask_name}; "
                     "the terminal reward must sit on the last action token (a reward on an observation "
                     "or padding token would be silently dropped)")


def _compacted_gae(values, rewards, mask, mask_name, gamma, lam):
    """Ordinary GAE over the positions where mask is True, taken in order; 0 elsewhere.

    flat:   the N masked tokens of all rows, row after row (row b holds flat[offset_b : offset_b + n_b])
    padded: [B, K] with K = max n_b, row b's tokens left-aligned and zeros after them (for the scan)
    """
    batch, length = values.shape
    device = values.device
    flat_pos = mask.reshape(-1).nonzero().squeeze(1)  # [N] positions in the flattened [B * T]
    v = values.reshape(-1).index_select(0, flat_pos).float()
    r = rewards.reshape(-1).index_select(0, flat_pos).float()
    if torch.count_nonzero(rewards) != torch.count_nonzero(r):  # some reward sits outside the mask
        _reject_rewards_outside(rewards, mask, mask_name)
    advantages = torch.zeros(batch * length, dtype=torch.float32, device=device)
    returns = torch.zeros_like(advantages)
    num = flat_pos.numel()
    if num > 0:
        bounds = torch.searchsorted(flat_pos, torch.arange(batch + 1, device=device) * length)
        offsets, ends = bounds[:-1], bounds[1:]  # row b is flat[offset_b : end_b]
        counts = ends - offsets  # n_b
        v_next = torch.nn.functional.pad(v[1:], (0, 1))  # V_{k+1} ...
        v_next[ends[counts > 0] - 1] = 0.0  # ... and 0 after each row's last token
        delta = r + gamma * v_next - v
        k = torch.arange(int(counts.max()), device=device)
        to_pad = (offsets[:, None] + k[None, :]).clamp_(max=num - 1)  # flat index of padded slot (b, k)
        delta_pad = delta.index_select(0, to_pad.view(-1)).view(to_pad.shape)
        delta_pad.masked_fill_(k[None, :] >= counts[:, None], 0.0)
        adv_pad = discounted_reverse_cumsum(delta_pad, gamma * lam)  # A_k = delta_k + gamma lam A_{k+1}
        row_shift = torch.arange(batch, device=device) * k.numel() - offsets
        # the padded slot of each flat token: b * K + (i - offset_b)
        to_flat = torch.arange(num, device=device) + torch.repeat_interleave(row_shift, counts)
        adv = adv_pad.reshape(-1).index_select(0, to_flat)
        advantages.scatter_(0, flat_pos, adv)
        returns.scatter_(0, flat_pos, adv + v)
    return advantages.view(batch, length), returns.view(batch, length)


def skip_observation_gae(values: torch.Tensor, rewards: torch.Tensor, action_mask: torch.Tensor,
                         gamma: float = 1.0, lam=1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Observation-skipping token-level GAE (docs/algorithm.md section 3, Eq. 4-5)
    -> (advantages, returns), fp32 [B, T].

    values, rewards: [B, T]; action_mask: bool [B, T]; lam: float or tensor [B] (one per row).
    The recursion runs over action tokens only, bridging from the last token of an action segment to
    the first token of the next. Outputs are 0 at non-action positions; returns = advantages + values
    at action positions. A nonzero reward outside action_mask raises ValueError.
    """
    lam = _check_inputs(values, rewards, action_mask, "action_mask", gamma, lam)
    return _compacted_gae(values, rewards, action_mask, "action_mask", gamma, lam)


def token_gae(values: torch.Tensor, rewards: torch.Tensor, valid_mask: torch.Tensor,
              gamma: float = 1.0, lam=1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Ordinary GAE through every valid position, observations included (the skip ablation).

    valid_mask: bool [B, T], True at real tokens (False at padding). Same conventions as
    skip_observation_gae: outputs 0 outside valid_mask, a nonzero reward outside it raises.
    """
    lam = _check_inputs(values, rewards, valid_mask, "valid_mask", gamma, lam)
    return _compacted_gae(values, rewards, valid_mask, "valid_mask", gamma, lam)
