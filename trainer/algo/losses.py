"""Policy and value losses, advantage baselines and importance weights (docs/algorithm.md sections 1, 4, 6).

Conventions: per-token tensors are [B, T]; `action_mask` (bool) marks the trained tokens and every
reduction runs over it only, so whatever sits at observation or padding positions (logp, rollout
logprobs, advantages) never reaches a loss or its gradient. Token losses are sums over action tokens
divided by `normalizer` (by default the number of action tokens, i.e. a token mean); pass
`normalizer=1.0` to get the sum when the caller accumulates micro-batches and divides the gradients
by the batch's count itself. Metrics are Python floats.
"""
from __future__ import annotations

import math
from collections import defaultdict, deque
from typing import Literal

import torch


def _check_same_shape(mask: torch.Tensor, **tensors: torch.Tensor) -> None:
    if mask.dtype != torch.bool:
        raise ValueError(f"action_mask must be a bool tensor, got {mask.dtype}")
    for name, t in tensors.items():
        if t.shape != mask.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected the action_mask shape {tuple(mask.shape)}")


def _clean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x at action tokens (where finite), 0 elsewhere, so no inf/nan from other positions can leak into
    a product or its gradient (torch.where sends a zero gradient to the positions it drops)."""
    return torch.where(mask & torch.isfinite(x), x, torch.zeros((), dtype=x.dtype, device=x.device))


# --- DIS (docs/algorithm.md section 1) -----------------------------------------------------------

def dis_policy_loss(logp: torch.Tensor, logp_rollout: torch.Tensor, advantages: torch.Tensor,
                    action_mask: torch.Tensor, eps_low: float, eps_high: float,
                    grad: Literal["score", "literal"] = "score",
                    denominator: Literal["all", "kept"] = "all",
                    normalizer: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Direct double-sided importance sampling, docs/algorithm.md section 1 (Eq. 1-3).

        r_t = exp(logp_t - logp_rollout_t)
        m_t = 1[log(1 - eps_low) < log r_t < log(1 + eps_high)]     (open interval, both sides,
                                                                      whatever the sign of A_t)
        grad="score":   loss = -(1/N) sum_t m_t * sg(r_t) * A_t * logp_t   -> grad = m r A grad logp
        grad="literal": loss = -(1/N) sum_t m_t * r_t * A_t * logp_t       (Eq. 1 differentiated as is)
        N = all action tokens (denominator="all") or the kept ones ("kept"); `normalizer` overrides N.
    """
    _check_same_shape(action_mask, logp=logp, logp_rollout=logp_rollout, advantages=advantages)
    if not 0.0 <= eps_low <= 1.0:
        raise ValueError(f"eps_low must be in [0, 1], got {eps_low}")
    if eps_high < 0:
        raise ValueError(f"eps_high must be >= 0, got {eps_high}")
    if grad not in ("score", "literal"):
        raise ValueError(f"grad must be 'score' or 'literal', got {grad!r}")
    if denominator not in ("all", "kept"):
        raise ValueError(f"denominator must be 'all' or 'kept', got {denominator!r}")

    if not torch.isfinite(logp_rollout[action_mask]).all():
        raise ValueError("logp_rollout must be finite at every action token")
    # A token the current policy cannot produce (logp = -inf, e.g. outside top-k/top-p) has r = 0.
    valid = action_mask & torch.isfinite(logp)
    logp_c = _clean(logp, valid)
    log_ratio = torch.where(valid, logp_c.detach().float() - logp_rollout.float(), -math.inf)
    lower = -math.inf if eps_low >= 1.0 else math.log1p(-eps_low)
    upper = math.log1p(eps_high)
    below = action_mask & (log_ratio <= lower)
    above = action_mask & (log_ratio >= upper)
    kept = valid & (log_ratio > lower) & (log_ratio < upper)

    adv = _clean(advantages, action_mask)
    if grad == "score":
        ratio = torch.exp(_clean(log_ratio, kept))  # sg(r_t)
    else:
        ratio = torch.exp(logp_c - _clean(logp_rollout, kept))  # r_t, differentiated
    per_token = torch.where(kept, -ratio * adv * logp_c, 0.0)

    num_action = int(action_mask.sum())
    num_kept = int(kept.sum())
    if normalizer is None:
        normalizer = max(num_action if denominator == "all" else num_kept, 1)
    loss = per_token.sum() / normalizer

    ratio_all = torch.exp(log_ratio)[action_mask]
    metrics = {
        "dis_masked_low_frac": below.sum().item() / max(num_action, 1),
        "dis_masked_high_frac": above.sum().item() / max(num_action, 1),
        "dis_kept_frac": num_kept / max(num_action, 1),
        "ratio_mean": ratio_all.mean().item() if num_action else 0.0,
        "ratio_min": ratio_all.min().item() if num_action else 0.0,
        "ratio_max": ratio_all.max().item() if num_action else 0.0,
        "num_action_tokens": float(num_action),
        "num_kept_tokens": float(num_kept),
    }
    return loss, metrics


# --- PPO clipped surrogate with clip-higher -----------------------------------------------------

def ppo_policy_loss(logp: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor,
                    action_mask: torch.Tensor, clip_low: float = 0.2, clip_high: float = 0.28,
                    weights: torch.Tensor | None = None,
                    normalizer: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate with clip-higher (DAPO), token mean over action tokens.

        r_t = exp(logp_t - logp_old_t)
        loss = -(1/N) sum_t w_t * min(r_t A_t, clip(r_t, 1 - clip_low, 1 + clip_high) A_t)
    w_t: optional importance weights (TIS / MIS against the rollout engine), treated as constants.
    """
    _check_same_shape(action_mask, logp=logp, logp_old=logp_old, advantages=advantages)
    if weights is not None:
        _check_same_shape(action_mask, weights=weights)
    if not 0.0 <= clip_low <= 1.0 or clip_high < 0:
        raise ValueError(f"clip_low must be in [0, 1] and clip_high >= 0, got {clip_low}, {clip_high}")
    ratio = torch.exp(_clean(logp, action_mask) - _clean(logp_old, action_mask))
    adv = _clean(advantages, action_mask)
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv)
    if weights is not None:
        surrogate = surrogate * _clean(weights, action_mask).detach()
    per_token = torch.where(action_mask, -surrogate, 0.0)
    num_action = int(action_mask.sum())
    loss = per_token.sum() / (normalizer if normalizer is not None else max(num_action, 1))
    r = ratio.detach()[action_mask]
    clipped = ((r < 1.0 - clip_low) & (adv[action_mask] < 0)) | ((r > 1.0 + clip_high) & (adv[action_mask] > 0))
    metrics = {
        "ppo_clip_frac": clipped.float().mean().item() if num_action else 0.0,
        "ratio_mean": r.mean().item() if num_action else 0.0,
        "ratio_min": r.min().item() if num_action else 0.0,
        "ratio_max": r.max().item() if num_action else 0.0,
        "num_action_tokens": float(num_action),
    }
    return loss, metrics


# --- importance corrections against the rollout engine ------------------------------------------

def tis_weights(logp_old: torch.Tensor, logp_rollout: torch.Tensor, cap: float = 2.0) -> torch.Tensor:
    """Truncated importance sampling: w_t = min(pi_old / pi_rollout, C), a constant (no gradient)."""
    if cap <= 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    return torch.exp(logp_old.detach() - logp_rollout).clamp(max=cap)


def mis_weights(logp_old: torch.Tensor, logp_rollout: torch.Tensor, low: float = 0.5,
                high: float = 2.0) -> torch.Tensor:
    """Token-level masked importance sampling (IcePop): w_t = r_t * 1[low <= r_t <= high],
    r_t = pi_old / pi_rollout; tokens outside the window get weight 0. A constant (no gradient)."""
    if not 0 <= low <= high:
        raise ValueError(f"need 0 <= low <= high, got low={low}, high={high}")
    ratio = torch.exp(logp_old.detach() - logp_rollout)
    return torch.where((ratio >= low) & (ratio <= high), ratio, torch.zeros_like(ratio))


# --- value loss ---------------------------------------------------------------------------------

def value_loss(values: torch.Tensor, returns: torch.Tensor, action_mask: torch.Tensor,
               values_old: torch.Tensor | None = None, clip: float | None = None,
               normalizer: float | None = None) -> torch.Tensor:
    """0.5 * (V - G)^2, token mean over action tokens.

    With `clip` (and values_old, the values the returns were computed with), the PPO-style clipped
    form: 0.5 * max((V - G)^2, (V_old + clip(V - V_old, -c, c) - G)^2).
    """
    _check_same_shape(action_mask, values=values, returns=returns)
    v, g = _clean(values.float(), action_mask), _clean(returns.float(), action_mask)
    err = (v - g) ** 2
    if clip is not None:
        if values_old is None:
            raise ValueError("value clipping needs values_old (the values the returns were computed with)")
        v_old = _clean(values_old.float(), action_mask).detach()
        v_clipped = v_old + (v - v_old).clamp(-clip, clip)
        err = torch.maximum(err, (v_clipped - g) ** 2)
    n = normalizer if normalizer is not None else max(int(action_mask.sum()), 1)
    return 0.5 * torch.where(action_mask, err, 0.0).sum() / n


# --- advantage post-processing and diagnostics --------------------------------------------------

def whiten_advantages(advantages: torch.Tensor, action_mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(A - mean) / (std + eps) over the batch's action tokens; 0 elsewhere."""
    _check_same_shape(action_mask, advantages=advantages)
    vals = advantages[action_mask].float()
    if vals.numel() == 0:
        return torch.zeros_like(advantages, dtype=torch.float32)
    mean, std = vals.mean(), vals.std(unbiased=False)
    return torch.where(action_mask, (advantages.float() - mean) / (std + eps), 0.0)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, action_mask: torch.Tensor) -> float:
    """1 - Var(G - V) / Var(G) over action tokens; nan when Var(G) ~ 0 (nothing to explain: returns equal up
    to rounding, e.g. every reward 0, where the ratio would be rounding noise over rounding noise)."""
    _check_same_shape(action_mask, values=values, returns=returns)
    v, g = values[action_mask].double(), returns[action_mask].double()
    if g.numel() == 0:
        return float("nan")
    var_g = g.var(unbiased=False)
    if var_g <= 1e-12 * max(1.0, g.abs().max().item() ** 2):
        return float("nan")
    return (1.0 - (g - v).var(unbiased=False) / var_g).item()


# --- baselines without a critic (docs/algorithm.md section 6) ------------------------------------

def grpo_advantages(rewards: torch.Tensor, group_ids, eps: float = 1e-6) -> torch.Tensor:
    """GRPO: A_i = (R_i - mean_G R) / (std_G R + eps) over the group G of trajectory i.

    rewards: [N]; group_ids: N hashable group keys (the task id). std is the sample standard deviation
    (Bessel-corrected, as TRL and verl compute it); a group of one has std 0 and A = 0.
    """
    rewards = torch.as_tensor(rewards, dtype=torch.float64)
    if rewards.dim() != 1 or len(group_ids) != rewards.shape[0]:
        raise ValueError(f"rewards must be 1-D with one group id each, got shape {tuple(rewards.shape)} "
                         f"and {len(group_ids)} group ids")
    keys = {k: i for i, k in enumerate(dict.fromkeys(group_ids))}
    index = torch.tensor([keys[k] for k in group_ids], dtype=torch.long)
    num_groups = len(keys)
    count = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, index, torch.ones_like(rewards))
    mean = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, index, rewards) / count
    sq = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, index, (rewards - mean[index]) ** 2)
    std = torch.where(count > 1, (sq / (count - 1).clamp(min=1)).sqrt(), torch.zeros_like(sq))
    return ((rewards - mean[index]) / (std[index] + eps)).float()


class RunningMeanBaseline:
    """A = R - mean of the last W rewards seen (per task, or one global window).

    The baseline of a batch is taken from earlier rewards only (a trajectory never sees its own
    reward or its batch-mates'), then the batch's rewards enter the windows. No history: baseline 0.
    """

    def __init__(self, window: int = 8, scope: Literal["task", "global"] = "task"):
        if window <= 0:
            raise ValueError(f"window must be > 0, got {window}")
        if scope not in ("task", "global"):
            raise ValueError(f"scope must be 'task' or 'global', got {scope!r}")
        self.window, self.scope = window, scope
        self.history: dict[str, deque] = defaultdict(lambda: deque(maxlen=self.window))

    def _key(self, task_id: str) -> str:
        return task_id if self.scope == "task" else "__global__"

    def baseline(self, task_id: str) -> float:
        h = self.history.get(self._key(task_id))
        return sum(h) / len(h) if h else 0.0

    def advantages(self, task_ids: list[str], rewards) -> torch.Tensor:
        """Advantages of one batch (one per trajectory), then record its rewards."""
        rewards = [float(r) for r in rewards]
        if len(task_ids) != len(rewards):
            raise ValueError(f"got {len(task_ids)} task ids for {len(rewards)} rewards")
        adv = torch.tensor([r - self.baseline(t) for t, r in zip(task_ids, rewards)], dtype=torch.float32)
        for t, r in zip(task_ids, rewards):
            self.history[self._key(t)].append(r)
        return adv

    def state_dict(self) -> dict:
        return {"window": self.window, "scope": self.scope, "history": {k: list(v) for k, v in self.history.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.window, self.scope = state["window"], state["scope"]
        self.history = defaultdict(lambda: deque(maxlen=self.window))
        for k, v in state["history"].items():
            self.history[k].extend(v)
