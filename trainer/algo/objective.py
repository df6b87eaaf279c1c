"""The configured objective: which advantage estimator and which policy loss an update uses.

    A, G = compute_advantages(batch, V)     gae: observation-skipping (or token) GAE with lambda_p for A
                                            and lambda_c for G; grpo: group-normalised R on every action
                                            token; running_mean: R - mean of the last W rewards
    A    = whiten(A)                        SAO's switch (never for GRPO: already normalised per group)
    loss = policy_loss(logp, A)             dis: docs/algorithm.md section 1 against the rollout logprobs;
                                            ppo: the clipped surrogate against pi_old, optionally TIS/MIS

The equations live in trainer.algo.gae and trainer.algo.losses; this module only maps the config onto them.
"""
from __future__ import annotations

import torch

from sao_harness.trainer.algo.batch import TrajectoryBatch
from sao_harness.trainer.algo.gae import length_adaptive_lambda, skip_observation_gae, token_gae
from sao_harness.trainer.algo.losses import (
    RunningMeanBaseline,
    dis_policy_loss,
    grpo_advantages,
    mis_weights,
    ppo_policy_loss,
    tis_weights,
    whiten_advantages,
)
from sao_harness.trainer.config import TrainerConfig


def value_mask(batch: TrajectoryBatch, config: TrainerConfig) -> torch.Tensor:
    """The tokens whose values the advantages use (and the critic trains on): the action tokens with
    observation-skipping GAE; every real token but position 0 (V = 0 there, no predictor) without."""
    if config.skip_observations:
        return batch.action_mask
    mask = batch.attention_mask.clone()
    mask[:, 0] = False
    return mask


def compute_advantages(batch: TrajectoryBatch, values: torch.Tensor | None, config: TrainerConfig,
                       baseline: RunningMeanBaseline | None = None):
    """-> (advantages [B, T] before whitening, 0 off action tokens; returns [B, T], 0 off the value
    tokens, or None)."""
    mask = batch.action_mask
    if config.advantage == "gae":
        if values is None:
            raise ValueError("advantage='gae' needs the critic's values")
        if config.policy_lambda == "adaptive":
            lam_p = length_adaptive_lambda(batch.num_action_tokens, config.lambda_alpha)
        else:
            lam_p = float(config.policy_lambda)
        if config.skip_observations:
            def gae(lam):
                return skip_observation_gae(values, batch.rewards, mask, config.gamma, lam)
        else:
            def gae(lam):
                return token_gae(values, batch.rewards, batch.attention_mask, config.gamma, lam)
        advantages = gae(lam_p)[0] * mask
        returns = gae(config.critic_lambda)[1] * value_mask(batch, config)
        return advantages, returns
    if config.advantage == "grpo":
        per_traj = grpo_advantages(batch.reward, batch.task_ids, config.grpo_eps)
    elif config.advantage == "running_mean":
        if baseline is None:
            raise ValueError("advantage='running_mean' needs a RunningMeanBaseline")
        per_traj = baseline.advantages(batch.task_ids, batch.reward.tolist())
    else:
        raise ValueError(f"unknown advantage estimator {config.advantage!r}")
    return per_traj[:, None] * mask, None


def training_advantages(batch: TrajectoryBatch, values: torch.Tensor | None, config: TrainerConfig,
                        baseline: RunningMeanBaseline | None = None, whiten=whiten_advantages):
    """-> (raw advantages, the advantages the policy step uses, returns). Whitening over the batch's
    action tokens is an SAO choice (gae, running_mean); GRPO's advantages are already normalised per
    group and are used as they are. `whiten`: data-parallel, over every rank's tokens."""
    raw, returns = compute_advantages(batch, values, config, baseline)
    if config.whiten_advantages and config.advantage != "grpo":
        return raw, whiten(raw, batch.action_mask), returns
    return raw, raw, returns


def policy_loss(logp: torch.Tensor, logp_rollout: torch.Tensor, advantages: torch.Tensor,
                action_mask: torch.Tensor, config: TrainerConfig, normalizer: float | None = None,
                logp_old: torch.Tensor | None = None):
    """The configured policy loss on [B, T] tensors -> (loss, metrics).

    dis: docs/algorithm.md section 1 against the rollout logprobs. ppo: clipped surrogate against pi_old, the
    policy before this update (`logp_old`; None: logp detached, exact for the first step of an
    update), and TIS / MIS weight each token by pi_old / pi_rollout (the engine mismatch).
    """
    if config.policy_loss == "dis":
        return dis_policy_loss(logp, logp_rollout, advantages, action_mask, config.eps_low, config.eps_high,
                               grad=config.dis_grad, denominator=config.dis_denominator, normalizer=normalizer)
    logp_old = logp.detach() if logp_old is None else logp_old
    weights = None
    if config.importance == "tis":
        weights = tis_weights(logp_old, logp_rollout, config.tis_cap)
    elif config.importance == "mis":
        weights = mis_weights(logp_old, logp_rollout, config.mis_low, config.mis_high)
    loss, metrics = ppo_policy_loss(logp, logp_old, advantages, action_mask, config.ppo_clip_low,
                                    config.ppo_clip_high, weights=weights, normalizer=normalizer)
    if weights is not None:
        w = weights[action_mask]
        metrics["importance_weight_mean"] = w.mean().item() if w.numel() else 0.0
        metrics["importance_zero_frac"] = (w == 0).float().mean().item() if w.numel() else 0.0
    # the engine mismatch pi_old / pi_rollout, logged like DIS's ratio
    r = torch.exp(logp_old - logp_rollout)[action_mask]
    metrics.update(ratio_mean=r.mean().item() if r.numel() else 0.0, ratio_min=r.min().item() if r.numel() else 0.0,
                   ratio_max=r.max().item() if r.numel() else 0.0)
    return loss, metrics
