"""One SAO update: values -> advantages and returns -> K critic steps -> one policy step.

    batch      = build_batch(trajectories)                          padded [B, T] tensors
    V          = critic(batch)                                      no grad, micro-batched
    A          = GAE(V, r; lambda_p)   (policy_lambda, per row)     or GRPO / running mean
    G          = GAE(V, r; lambda_c) + V                            the critic's targets
    A          = whiten(A) over action tokens                       (switch)
    K times:   critic step on 0.5 (V - G)^2                         token mean over action tokens
    once:      policy step on the DIS (or PPO) loss                 token mean over action tokens

Micro-batches: rows are grouped so each forward holds at most `micro_batch_tokens` padded tokens;
each micro-batch's loss is a *sum* over its tokens, gradients accumulate, and are divided by the
batch's token count N before clipping, so the step equals the step on the whole batch.

Exclusions (never trained, always counted in the metrics): trajectories without a reward
(infra_error, agent_error, stale) and those older than `max_staleness` policy versions.
"""
from __future__ import annotations

import time

import torch
from torch import nn

from harness.trace import Trajectory
from trainer.batch import TrajectoryBatch, build_batch, micro_batches
from trainer.config import TrainerConfig
from trainer.gae import length_adaptive_lambda, skip_observation_gae, token_gae
from trainer.losses import (RunningMeanBaseline, dis_policy_loss, explained_variance, grpo_advantages,
                            mis_weights, ppo_policy_loss, tis_weights, value_loss, whiten_advantages)
from trainer.models import Critic, critic_freeze_patterns, freeze_parameters, policy_token_logprobs


def _rows(x: torch.Tensor, mb: TrajectoryBatch, rows: list[int]) -> torch.Tensor:
    """The rows of a [B, T] tensor that make up micro-batch mb (trimmed to its width), on mb's device."""
    return x[torch.tensor(rows, dtype=torch.long), :mb.input_ids.shape[1]].to(mb.input_ids.device)


def compute_advantages(batch: TrajectoryBatch, values: torch.Tensor | None, config: TrainerConfig,
                       baseline: RunningMeanBaseline | None = None):
    """-> (advantages [B, T] before whitening, returns [B, T] or None), 0 off action tokens."""
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
        returns = gae(config.critic_lambda)[1] * mask
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


def policy_loss(logp: torch.Tensor, logp_rollout: torch.Tensor, advantages: torch.Tensor,
                action_mask: torch.Tensor, config: TrainerConfig, normalizer: float | None = None):
    """The configured policy loss on [B, T] tensors -> (loss, metrics).

    dis: sao.md Eq. 1-3 against the rollout logprobs. ppo: clipped surrogate against pi_old; one
    policy step per batch, so pi_old is the current policy (logp, detached: no extra forward), and
    TIS / MIS weight each token by pi_old / pi_rollout (the engine mismatch).
    """
    if config.policy_loss == "dis":
        return dis_policy_loss(logp, logp_rollout, advantages, action_mask, config.eps_low, config.eps_high,
                               grad=config.dis_grad, denominator=config.dis_denominator, normalizer=normalizer)
    logp_old = logp.detach()
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


def _grad_norm_and_clip(params: list[nn.Parameter], max_norm: float) -> float:
    params = [p for p in params if p.grad is not None]
    if not params:
        return 0.0
    return float(torch.nn.utils.clip_grad_norm_(params, max_norm))


class SAOTrainer:
    """Holds the policy, the critic, their optimizers and the counters; `update` is one SAO step."""

    def __init__(self, policy: nn.Module, critic: Critic | None, config: TrainerConfig, policy_version: int = 0):
        if config.advantage == "gae" and critic is None:
            raise ValueError("critic: advantage='gae' needs a critic (pass Critic.from_policy(policy))")
        self.policy, self.critic, self.config = policy, critic, config
        self.policy_version = policy_version
        self.device = next(policy.parameters()).device  # micro-batches move here; GAE and metrics stay on CPU
        self.pad_token_id = getattr(policy.config, "pad_token_id", None) or 0
        self.policy_params = [p for p in policy.parameters() if p.requires_grad]
        self.policy_optimizer = torch.optim.AdamW(self.policy_params, lr=config.lr, weight_decay=config.weight_decay)
        self.frozen_critic_params: list[str] = []
        self.critic_optimizer = None
        if critic is not None:
            patterns = critic_freeze_patterns(config.critic_freeze, config.critic_freeze_norms,
                                              config.critic_freeze_router, config.critic_freeze_embeddings)
            self.frozen_critic_params = freeze_parameters(critic, patterns)
            self.critic_params = [p for p in critic.parameters() if p.requires_grad]
            self.critic_optimizer = torch.optim.AdamW(self.critic_params, lr=config.critic_lr,
                                                      weight_decay=config.weight_decay)
        self.baseline = (RunningMeanBaseline(config.window, config.running_mean_scope)
                         if config.advantage == "running_mean" else None)
        self.updates = 0  # calls of update() that trained something
        self.critic_optimizer_steps = 0
        self.policy_optimizer_steps = 0

    # --- the pieces -----------------------------------------------------------------------------
    def _select(self, trajectories: list[Trajectory]):
        """Drop (and count) the unrewarded and the too-stale trajectories."""
        kept, unrewarded, stale = [], 0, 0
        for traj in trajectories:
            if traj.reward is None:
                unrewarded += 1
            elif traj.versions and self.policy_version - traj.versions[0] > self.config.max_staleness:
                stale += 1
            else:
                kept.append(traj)
        return kept, unrewarded, stale

    @torch.no_grad()
    def compute_values(self, batch: TrajectoryBatch, groups: list[list[int]]) -> torch.Tensor:
        values = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        for rows in groups:
            mb = batch.select(rows).to(self.device)
            v = torch.where(mb.attention_mask, self.critic(mb.input_ids, mb.attention_mask), 0.0)
            values[torch.tensor(rows)[:, None], torch.arange(v.shape[1])[None, :]] = v.float().cpu()
        return values

    def _critic_steps(self, batch, groups, returns, values_old) -> dict[str, float]:
        cfg, n_action = self.config, max(int(batch.action_mask.sum()), 1)
        losses, grad_norms = [], []
        for _ in range(cfg.critic_steps):
            warmup = 1.0
            if cfg.critic_warmup_steps:  # linear LR warm-up over the first critic optimizer steps
                warmup = min(1.0, (self.critic_optimizer_steps + 1) / cfg.critic_warmup_steps)
            for group in self.critic_optimizer.param_groups:
                group["lr"] = cfg.critic_lr * warmup
            self.critic_optimizer.zero_grad(set_to_none=True)
            total = 0.0
            for rows in groups:
                mb = batch.select(rows).to(self.device)
                v = self.critic(mb.input_ids, mb.attention_mask)
                loss = value_loss(v, _rows(returns, mb, rows), mb.action_mask, _rows(values_old, mb, rows),
                                  clip=cfg.value_clip, normalizer=n_action)
                loss.backward()
                total += loss.item()
            grad_norms.append(_grad_norm_and_clip(self.critic_params, cfg.max_grad_norm))
            self.critic_optimizer.step()
            self.critic_optimizer_steps += 1
            losses.append(total)
        return {"value_loss": losses[0], "value_loss_last_step": losses[-1],
                "critic_grad_norm": sum(grad_norms) / len(grad_norms),
                "critic_lr": self.critic_optimizer.param_groups[0]["lr"]}

    def _policy_step(self, batch, groups, advantages) -> tuple[torch.Tensor, torch.Tensor, float]:
        """Accumulate the summed loss over micro-batches, divide the gradients by N, clip, step.
        Returns the detached logp and entropy [B, T] of the pre-step policy and the gradient norm."""
        cfg = self.config
        logp_all = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        entropy_all = torch.zeros_like(logp_all)
        self.policy_optimizer.zero_grad(set_to_none=True)
        num_kept = 0.0
        for rows in groups:
            mb = batch.select(rows).to(self.device)
            logp, entropy = policy_token_logprobs(self.policy, mb.input_ids, mb.attention_mask, mb.action_mask,
                                                  cfg.temperature, cfg.top_k, cfg.top_p, cfg.logprob_chunk)
            loss_sum, metrics = policy_loss(logp, mb.logp_rollout, _rows(advantages, mb, rows), mb.action_mask,
                                            cfg, normalizer=1.0)
            loss_sum.backward()
            num_kept += metrics.get("num_kept_tokens", 0.0)
            index = (torch.tensor(rows)[:, None], torch.arange(logp.shape[1])[None, :])
            logp_all[index], entropy_all[index] = logp.detach().cpu(), entropy.detach().cpu()
        if cfg.policy_loss == "dis" and cfg.dis_denominator == "kept":
            n = num_kept
        else:
            n = float(batch.action_mask.sum())
        for p in self.policy_params:
            if p.grad is not None:
                p.grad.div_(max(n, 1.0))
        grad_norm = _grad_norm_and_clip(self.policy_params, cfg.max_grad_norm)
        self.policy_optimizer.step()
        self.policy_optimizer_steps += 1
        self.policy_version += 1
        return logp_all, entropy_all, grad_norm

    # --- the step -------------------------------------------------------------------------------
    def update(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """One SAO update on a batch of finished trajectories -> the metrics of sao.md section 7."""
        cfg = self.config
        metrics: dict[str, float] = {}
        n_in = len(trajectories)
        kept, unrewarded, stale = self._select(trajectories)
        metrics.update(
            trajectories_in=float(n_in), excluded_unrewarded=float(unrewarded), dropped_stale=float(stale),
            infra_failure_rate=sum(t.status == "infra_error" for t in trajectories) / max(n_in, 1),
        )
        if not kept:
            return metrics | {"skipped_update": 1.0, "policy_version": float(self.policy_version)}
        self.policy.train(False)  # no dropout: the engine samples without it
        if self.critic is not None:
            self.critic.train(False)

        batch = build_batch(kept, self.pad_token_id)
        groups = micro_batches(batch, cfg.micro_batch_tokens)
        mask = batch.action_mask
        t0 = time.perf_counter()
        use_critic = cfg.advantage == "gae"
        values = self.compute_values(batch, groups) if use_critic else None
        advantages_raw, returns = compute_advantages(batch, values, cfg, self.baseline)
        advantages = whiten_advantages(advantages_raw, mask) if cfg.whiten_advantages else advantages_raw
        t1 = time.perf_counter()

        if use_critic:
            metrics["explained_variance"] = explained_variance(values, returns, mask)
            metrics.update(_stats(values, mask, "value"))
            metrics.update(_stats(returns, mask, "return"))
            if cfg.critic_steps > 0:
                metrics.update(self._critic_steps(batch, groups, returns, values))
        t2 = time.perf_counter()

        train_policy = self.updates >= cfg.critic_only_steps
        if train_policy:
            version_before = self.policy_version
            logp, entropy, grad_norm = self._policy_step(batch, groups, advantages)
            with torch.no_grad():
                loss, loss_metrics = policy_loss(logp, batch.logp_rollout, advantages, mask, cfg)
            diff = (logp - batch.logp_rollout).abs()[mask]
            diff = diff[torch.isfinite(diff)]  # a token outside top-k / top-p now has logp = -inf
            lag = (version_before - batch.policy_version)[mask].float()
            metrics.update(loss_metrics)
            metrics.update(
                policy_loss=loss.item(), policy_grad_norm=grad_norm,
                entropy_mean=entropy[mask].mean().item() if mask.any() else 0.0,
                logp_abs_diff_mean=diff.mean().item() if diff.numel() else 0.0,
                logp_abs_diff_max=diff.max().item() if diff.numel() else 0.0,
                version_lag_mean=lag.mean().item() if mask.any() else 0.0,
                version_lag_max=lag.max().item() if mask.any() else 0.0,
            )
        t3 = time.perf_counter()
        self.updates += 1

        truncated = sum(t.status.startswith("truncated") for t in kept)
        metrics.update(_stats(advantages_raw, mask, "adv_raw"))
        metrics.update(_stats(advantages, mask, "adv"))
        metrics.update(
            skipped_update=0.0, policy_step=float(train_policy), policy_version=float(self.policy_version),
            critic_optimizer_steps=float(self.critic_optimizer_steps),
            trajectories=float(len(kept)), micro_batches=float(len(groups)),
            action_tokens=float(mask.sum()), action_tokens_per_traj=float(mask.sum()) / len(kept),
            tokens=float(batch.attention_mask.sum()), turns_mean=sum(t.turns for t in kept) / len(kept),
            truncation_rate=truncated / len(kept), reward_mean=batch.reward.mean().item(),
            reward_std=batch.reward.std(unbiased=False).item(),
            time_advantages_s=t1 - t0, time_critic_s=t2 - t1, time_policy_s=t3 - t2,
        )
        return {k: float(v) for k, v in metrics.items()}


def _stats(x: torch.Tensor, mask: torch.Tensor, prefix: str) -> dict[str, float]:
    vals = x[mask].float()
    if vals.numel() == 0:
        return {f"{prefix}_mean": 0.0, f"{prefix}_std": 0.0}
    return {f"{prefix}_mean": vals.mean().item(), f"{prefix}_std": vals.std(unbiased=False).item()}
