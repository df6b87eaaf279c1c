"""One SAO update: values -> advantages and returns -> K critic steps -> one policy step.

    batch      = build_batch(trajectories)                          padded [B, T] tensors (per row)
    V          = critic(batch)                                      no grad, packed micro-batches
    A          = GAE(V, r; lambda_p)   (policy_lambda, per row)     or GRPO / running mean
    G          = GAE(V, r; lambda_c) + V                            the critic's targets
    A          = whiten(A) over action tokens                       (switch; never for GRPO, already
                                                                     normalised per group)
    K times:   critic step on 0.5 (V - G)^2                         token mean over the value tokens
    once:      policy step on the DIS loss                          token mean over action tokens
    (or PPO:   ppo_epochs x minibatches steps on the clipped loss against pi_old, the policy before
               this update)

Value tokens: the positions whose V the advantages use, so every value used is trained: the action
tokens (observation-skipping GAE), or every real token but the first (GAE through observations).

Precision and device (trainer.modeling.precision): the policy and critic become fp32 master weights on
`device` (runtime.device); every forward runs under autocast in the dtype the modules were loaded in (the
model dtype), every pass in train mode so activation checkpointing is active.

Micro-batches: whole trajectories packed end to end, at most `max_tokens_per_microbatch` real
tokens per forward, no padding (trainer.algo.batch.micro_batches / pack: position ids restart per
trajectory, attention stays inside each one). The model passes read their inputs from the padded
[B, T] batch at the packed tokens (`gather`) and write their outputs back (`scatter`), so GAE,
advantages and metrics stay per row. Each micro-batch's loss is a *sum* over its tokens, gradients
accumulate, and are divided by the batch's token count N before clipping, so the step equals the
step on the whole batch.

Exclusions (never trained, always counted in the metrics): trajectories without a reward
(infra_error, agent_error, stale), those older than `max_staleness` policy versions, and those with
history breaks (`rollout/break_frac`).

Routing replay (trainer.router_replay, trainer.router_replay module): on an MoE policy the policy's
forwards (the update's, and pi_old's) take the experts the engine recorded in the trace; the critic routes
on its own. `rollout/route_agreement` is the fraction of the engine's choices the trainer's router makes.

Breaks are skipped, not split into one row per piece. At a break the proxy restarted the token
sequence (the client rewrote its history), so a trajectory with breaks is several contexts. Split
with the reward on the last piece's last action token and nothing bridging the break, the earlier
piece would end on an action token with no reward and no successor: GAE (gamma = 1) would give its
actions the return 0, the credit of a failed episode, whatever the episode's outcome. Copying the
reward to every piece instead would count one episode as several samples (reward_mean, GRPO groups,
the running mean), and the length-adaptive lambda would see a piece's length, not the episode's.
Breaks are rare (the agent runs without a condenser, so only a client rewriting its history makes
one); `rollout/break_frac` says how rare.
"""
from __future__ import annotations

import contextlib
import time

import torch
from torch import nn

from sao_harness.harness.config import SamplingConfig
from sao_harness.harness.trace import TRUNCATED, Status, Trajectory
from sao_harness.trainer.algo.batch import PackedRows, TrajectoryBatch, build_batch, micro_batches, minibatches, pack
from sao_harness.trainer.algo.losses import RunningMeanBaseline, explained_variance, value_loss, whiten_advantages
from sao_harness.trainer.algo.objective import policy_loss, training_advantages, value_mask
from sao_harness.trainer.config import TrainerConfig
from sao_harness.trainer.modeling.models import (
    Critic,
    critic_freeze_patterns,
    freeze_parameters,
    policy_token_logprobs,
    use_packed_attention,
)
from sao_harness.trainer.modeling.precision import (
    autocast,
    enable_activation_checkpointing,
    model_dtype,
    to_master_weights,
    train_mode,
)
from sao_harness.trainer.modeling.router_replay import RouterReplay, check_routes


def _grad_norm_and_clip(params: list[nn.Parameter], max_norm: float) -> float:
    params = [p for p in params if p.grad is not None]
    if not params:
        return 0.0
    return float(torch.nn.utils.clip_grad_norm_(params, max_norm))


class SAOTrainer:
    """Holds the policy, the critic, their optimizers and the counters; `update` is one SAO step.

    The modules become fp32 master weights on `device` (in place); `dtype` is the compute dtype of the
    forward passes, by default the dtype the policy was loaded in (the model dtype). Logprobs are
    recomputed under the rollout's `sampling` distribution (temperature, top_k, top_p).
    """

    def __init__(self, policy: nn.Module, critic: Critic | None, config: TrainerConfig, policy_version: int = 0,
                 dtype: torch.dtype | None = None, *, sampling: SamplingConfig | None = None,
                 device: torch.device | str = "cpu"):
        if config.advantage == "gae" and critic is None:
            raise ValueError("critic: advantage='gae' needs a critic (pass Critic.from_policy(policy))")
        self.policy, self.critic, self.config = policy, critic, config
        self.sampling = sampling or SamplingConfig()
        self.policy_version = policy_version
        self.dtype = dtype or model_dtype(policy)
        self.device = torch.device(device)  # micro-batches move here; GAE and metrics stay on CPU
        for module in (policy, critic):
            if module is not None:
                to_master_weights(module).to(self.device)
        use_packed_attention(policy, config.attn_impl)  # packed micro-batches: no [L, L] mask (trainer.modeling.models)
        if critic is not None:
            use_packed_attention(critic.backbone, config.attn_impl)
        if config.gradient_checkpointing:
            enable_activation_checkpointing(policy)
            if critic is not None:
                enable_activation_checkpointing(critic.backbone)
        self.replay = RouterReplay(policy)  # the routers, patched: replay only inside `_routing`
        if config.router_replay == "on" and not self.replay.is_moe:
            raise ValueError("trainer.router_replay=on: the policy has no MoE router to replay; use auto or off")
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
        self.dist = None  # data-parallel (trainer.dist.distributed.DataParallel): global sums, balanced passes
        self.critic_optimizer_steps = 0
        self.policy_optimizer_steps = 0

    COUNTERS = ("policy_version", "updates", "critic_optimizer_steps", "policy_optimizer_steps")

    def state_dict(self) -> dict[str, int]:
        """Its counters, as a checkpoint's state.json holds them (weights and optimizers: trainer.dist.checkpoint)."""
        return {k: getattr(self, k) for k in self.COUNTERS}

    def load_state_dict(self, state: dict) -> None:
        for k in self.COUNTERS:
            setattr(self, k, state[k])

    # --- the pieces -----------------------------------------------------------------------------
    def _sum(self, x: float) -> float:
        """x summed over the data-parallel ranks (x in one process)."""
        return x if self.dist is None else self.dist.sum(x)

    def _balance(self, module: nn.Module, passes: int, backward: bool = False) -> None:
        """Data-parallel: zero-loss passes up to the ranks' most (``self._most_passes``, asked before the
        update's first pass), so FSDP's collectives pair up."""
        if self.dist is not None:
            self.dist.zero_passes(module, self._most_passes - passes, self.pad_token_id, self.device, self.dtype,
                                  backward)

    def _select(self, trajectories: list[Trajectory]):
        """Drop (and count) the unrewarded, the too-stale and the broken (history breaks: see the module
        doc) trajectories: ``(kept, unrewarded, stale, broken)``."""
        kept, unrewarded, stale, broken = [], 0, 0, 0
        for traj in trajectories:
            if traj.reward is None:
                unrewarded += 1
            elif traj.versions and self.policy_version - traj.versions[0] > self.config.max_staleness:
                stale += 1
            elif traj.breaks:
                broken += 1
            else:
                kept.append(traj)
        return kept, unrewarded, stale, broken

    @torch.no_grad()
    def compute_values(self, batch: TrajectoryBatch, groups: list[list[int]]) -> torch.Tensor:
        values = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        for rows in groups:
            mb = pack(batch, rows).to(self.device)
            with autocast(self.device, self.dtype):
                mb.scatter(self.critic(mb.input_ids, position_ids=mb.position_ids), values)
        self._balance(self.critic, len(groups))
        return values

    def _critic_steps(self, batch, groups, returns, values_old, trained) -> dict[str, float]:
        """K steps on the value loss over the `trained` tokens [B, T] (the value tokens)."""
        cfg, n_trained = self.config, max(self._sum(int(trained.sum())), 1)
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
                mb = pack(batch, rows).to(self.device)
                with autocast(self.device, self.dtype):
                    v = self.critic(mb.input_ids, position_ids=mb.position_ids)
                loss = value_loss(v, mb.gather(returns), mb.gather(trained), mb.gather(values_old),
                                  clip=cfg.value_clip, normalizer=n_trained)
                loss.backward()
                total += loss.item()
            self._balance(self.critic, len(groups), backward=True)
            grad_norms.append(_grad_norm_and_clip(self.critic_params, cfg.max_grad_norm))
            self.critic_optimizer.step()
            self.critic_optimizer_steps += 1
            losses.append(total)
        losses = [losses[0], losses[-1]] if self.dist is None else self.dist._reduce([losses[0], losses[-1]])
        return {"loss/value_loss": losses[0], "loss/value_loss_last_step": losses[-1],
                "critic/grad_norm": sum(grad_norms) / len(grad_norms),
                "critic/lr": self.critic_optimizer.param_groups[0]["lr"]}

    def _check_routes(self, trajectories: list[Trajectory]) -> None:
        """An MoE policy: every trace's routes are this policy's; with router_replay=on, every trace has them."""
        if not self.replay.is_moe:
            return
        for traj in trajectories:
            where = f"trajectory {traj.traj_id} (task {traj.task_id})"
            if traj.routed_experts is not None:
                check_routes(torch.from_numpy(traj.routed_experts), self.replay, where)
            elif self.config.router_replay == "on":
                raise ValueError(f"{where}: no routed_experts, and trainer.router_replay=on replays the engine's "
                                 "routes on this MoE policy: record them (the hf engine, or vllm on GPUs, with an "
                                 "MoE model) or set trainer.router_replay=auto or off")

    def _routing(self, mb: PackedRows):
        """The context of a policy pass on `mb`: the engine's routes replayed (router_replay on / auto), or only
        measured (off); nothing without routes or on a dense policy."""
        if mb.routes is None or not self.replay.is_moe:
            return contextlib.nullcontext()
        return self.replay.replaying(mb.routes, observe=self.config.router_replay == "off")

    def _logprobs(self, mb: PackedRows):
        cfg, s = self.config, self.sampling
        with autocast(self.device, self.dtype):
            return policy_token_logprobs(self.policy, mb.input_ids, None, mb.action_mask, s.temperature,
                                         s.top_k, s.top_p, cfg.logprob_chunk, position_ids=mb.position_ids)

    @torch.no_grad()
    def _pi_old(self, batch, groups) -> tuple[torch.Tensor, torch.Tensor]:
        """(logp, entropy) [B, T] of the policy as it is now (before this update), no gradient."""
        logp_old, entropy_old = torch.zeros(batch.input_ids.shape), torch.zeros(batch.input_ids.shape)
        for rows in groups:
            mb = pack(batch, rows).to(self.device)
            with self._routing(mb):
                logp, entropy = self._logprobs(mb)
            mb.scatter(logp, logp_old)
            mb.scatter(entropy, entropy_old)
        self._balance(self.policy, len(groups))
        return logp_old, entropy_old

    def _optimizer_step(self, batch, groups, advantages, logp_old, record=None) -> tuple[float, dict]:
        """Accumulate the summed loss over micro-batches, divide the gradients by N, clip, step.
        `record(mb, logp, entropy)` sees each packed micro-batch's pre-step logp and entropy [1, L].
        Returns the gradient norm and the token-weighted ppo_clip_frac of the step."""
        cfg = self.config
        self.policy_optimizer.zero_grad(set_to_none=True)
        num_kept, clipped = 0.0, 0.0
        for rows in groups:
            mb = pack(batch, rows).to(self.device)
            with self._routing(mb):  # forward and backward: a checkpointed layer's recompute routes alike
                logp, entropy = self._logprobs(mb)
                old = None if logp_old is None else mb.gather(logp_old)
                loss_sum, metrics = policy_loss(logp, mb.logp_rollout, mb.gather(advantages), mb.action_mask,
                                                cfg, normalizer=1.0, logp_old=old)
                loss_sum.backward()
            num_kept += metrics.get("num_kept_tokens", 0.0)
            clipped += metrics.get("ppo_clip_frac", 0.0) * metrics["num_action_tokens"]
            if record is not None:
                record(mb, logp, entropy)
        self._balance(self.policy, len(groups), backward=True)
        if cfg.policy_loss == "dis" and cfg.dis_denominator == "kept":
            n = self._sum(num_kept)
        else:
            n = self._sum(float(sum(int(batch.action_mask[r].sum()) for g in groups for r in g)))
        for p in self.policy_params:
            if p.grad is not None:
                p.grad.div_(max(n, 1.0))
        grad_norm = _grad_norm_and_clip(self.policy_params, cfg.max_grad_norm)
        warmup = min(1.0, (self.policy_optimizer_steps + 1) / cfg.lr_warmup_steps) if cfg.lr_warmup_steps else 1.0
        for group in self.policy_optimizer.param_groups:  # linear LR warm-up over the first policy steps
            group["lr"] = cfg.lr * warmup
        self.policy_optimizer.step()
        self.policy_optimizer_steps += 1
        return grad_norm, {"clipped": clipped, "tokens": n}

    def _policy_step(self, batch, groups, advantages) -> tuple[torch.Tensor, torch.Tensor, float, dict]:
        """DIS: one optimizer step on the whole batch. PPO: ppo_epochs x minibatches optimizer steps
        against pi_old (computed in a no-grad pass when there is more than one step). One new policy
        version either way. Returns the detached logp and entropy [B, T] of the pre-update policy, the
        mean gradient norm and the ppo_clip_frac over every training pass."""
        cfg = self.config
        if cfg.ppo_epochs * cfg.minibatches == 1:
            logp_all = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
            entropy_all = torch.zeros_like(logp_all)

            def record(mb, logp, entropy):
                mb.scatter(logp, logp_all)
                mb.scatter(entropy, entropy_all)

            grad_norm, clip = self._optimizer_step(batch, groups, advantages, None, record)
            grad_norms, clipped, tokens = [grad_norm], clip["clipped"], clip["tokens"]
        else:
            logp_all, entropy_all = self._pi_old(batch, groups)
            grad_norms, clipped, tokens = [], 0.0, 0.0
            for _ in range(cfg.ppo_epochs):
                for part in minibatches(len(batch), cfg.minibatches):
                    part_groups = micro_batches(batch, cfg.max_tokens_per_microbatch, part)
                    grad_norm, clip = self._optimizer_step(batch, part_groups, advantages, logp_all)
                    grad_norms.append(grad_norm)
                    clipped, tokens = clipped + clip["clipped"], tokens + clip["tokens"]
        self.policy_version += 1
        extra = {"policy/clip_frac": self._sum(clipped) / max(tokens, 1.0)} if cfg.policy_loss == "ppo" else {}
        return logp_all, entropy_all, sum(grad_norms) / len(grad_norms), extra

    # --- the step -------------------------------------------------------------------------------
    def update(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """One SAO update on a batch of finished trajectories -> the metrics of docs/algorithm.md section 7.

        Data-parallel, every metric is of the whole batch: the per-token ones are computed on every rank's
        tokens gathered (`_gather_tokens`), counts are summed, times are the slowest rank's."""
        cfg = self.config
        metrics: dict[str, float] = {}
        n_in = len(trajectories)
        kept, unrewarded, stale, broken = self._select(trajectories)
        self._check_routes(kept)
        metrics.update({
            "rollout/trajectories_in": float(n_in), "rollout/excluded_unrewarded": float(unrewarded),
            "rollout/dropped_stale": float(stale), "rollout/break_frac": broken / max(n_in, 1),
            "rollout/infra_failure_rate": sum(t.status == Status.INFRA_ERROR for t in trajectories) / max(n_in, 1),
        })
        if not kept:
            return metrics | {"policy/skipped_update": 1.0, "policy/version": float(self.policy_version)}
        for module in (self.policy, self.critic):  # train mode: activation checkpointing is active
            if module is not None:
                train_mode(module)

        batch = build_batch(kept, self.pad_token_id)
        groups = micro_batches(batch, cfg.max_tokens_per_microbatch)
        if self.dist is not None:  # before any pass: a rank in its own passes waits in FSDP's all-gather
            self._most_passes = self.dist.max(len(groups))
        mask = batch.action_mask
        t0 = time.perf_counter()
        use_critic = cfg.advantage == "gae"
        values = self.compute_values(batch, groups) if use_critic else None
        whiten = self.dist.whiten if self.dist else whiten_advantages
        advantages_raw, advantages, returns = training_advantages(batch, values, cfg, self.baseline, whiten)
        t1 = time.perf_counter()

        tokens = {"adv_raw": advantages_raw[mask], "adv": advantages[mask]}  # per-token values of the metrics
        if use_critic:
            trained = value_mask(batch, cfg)
            tokens.update(values=values[trained], returns=returns[trained])
            if cfg.critic_steps > 0:
                metrics.update(self._critic_steps(batch, groups, returns, values, trained))
        t2 = time.perf_counter()

        train_policy = self.updates >= cfg.critic_only_steps
        if train_policy:
            version_before = self.policy_version
            logp, entropy, grad_norm, step_metrics = self._policy_step(batch, groups, advantages)
            tokens.update(logp=logp[mask], logp_rollout=batch.logp_rollout[mask], entropy=entropy[mask],
                          lag=(version_before - batch.policy_version)[mask].float())
            metrics.update({"policy/grad_norm": grad_norm, "policy/lr": self.policy_optimizer.param_groups[0]["lr"]})
            agree, choices = self.replay.agreement()
            agree, choices = self._sum(agree), self._sum(choices)
            if choices:
                metrics["rollout/route_agreement"] = agree / choices
        t3 = time.perf_counter()
        self.updates += 1

        tokens = self._gather_tokens(tokens)
        metrics.update(token_metrics(tokens, cfg))
        if train_policy:
            metrics.update(step_metrics)  # PPO: the clip fraction over the training passes, not the no-grad one
        seconds = {"time/advantages_s": t1 - t0, "time/critic_s": t2 - t1, "time/policy_s": t3 - t2}
        if self.dist is not None:
            seconds = dict(zip(seconds, self.dist.reduce_max(list(seconds.values()))))
        n_kept, n_tokens = self._sum(len(kept)), self._sum(float(batch.attention_mask.sum()))
        n_action = float(tokens["adv"].numel())
        truncated = self._sum(sum(t.status in TRUNCATED for t in kept))
        rewards = self._gather_tokens({"r": batch.reward})["r"]
        metrics.update({
            "policy/skipped_update": 0.0, "policy/trained": float(train_policy),
            "policy/version": float(self.policy_version), "critic/optimizer_steps": float(self.critic_optimizer_steps),
            "rollout/trajectories": n_kept, "perf/micro_batches": self._sum(len(groups)),
            "rollout/action_tokens": n_action, "rollout/action_tokens_per_traj": n_action / n_kept,
            "rollout/tokens": n_tokens, "rollout/turns_mean": self._sum(sum(t.turns for t in kept)) / n_kept,
            "rollout/truncation_rate": truncated / n_kept, "rollout/reward_mean": rewards.mean().item(),
            "rollout/reward_std": rewards.std(unbiased=False).item(),
            "perf/update_tokens_per_s": n_tokens / max(sum(seconds.values()), 1e-9), **seconds,
        })
        return {k: float(v) for k, v in metrics.items()}

    def _gather_tokens(self, tokens: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Per-token (1-D) tensors of this rank -> those of every rank, concatenated (one process: as given)."""
        if self.dist is None:
            return tokens
        parts = self.dist.gather({k: v.detach().cpu() for k, v in tokens.items()})
        return {k: torch.cat([p[k] for p in parts]) for k in tokens}


def token_metrics(tokens: dict[str, torch.Tensor], cfg: TrainerConfig) -> dict[str, float]:
    """The metrics of the update's per-token values (1-D, the whole batch's): advantages over the action tokens,
    values and returns over the value tokens (gae), logprobs, entropy and version lag over the action tokens
    (when the policy trained), with the policy loss and its diagnostics on the pre-update logprobs."""
    metrics = {}
    metrics.update(_stats(tokens["adv_raw"], "policy/adv_raw"))
    metrics.update(_stats(tokens["adv"], "policy/adv"))
    if "values" in tokens:
        every = torch.ones_like(tokens["values"], dtype=torch.bool)
        metrics["critic/explained_variance"] = explained_variance(tokens["values"], tokens["returns"], every)
        metrics.update(_stats(tokens["values"], "critic/value"))
        metrics.update(_stats(tokens["returns"], "critic/return"))
    if "logp" in tokens:
        logp, logp_rollout, adv = tokens["logp"], tokens["logp_rollout"], tokens["adv"]
        every = torch.ones_like(logp, dtype=torch.bool)
        with torch.no_grad():
            loss, loss_metrics = policy_loss(logp, logp_rollout, adv, every, cfg)
        diff = (logp - logp_rollout).abs()
        diff = diff[torch.isfinite(diff)]  # a token outside top-k / top-p now has logp = -inf
        lag, n = tokens["lag"], logp.numel()
        metrics.update(_policy_metrics(loss_metrics))
        metrics.update({
            "loss/policy_loss": loss.item(), "policy/entropy": tokens["entropy"].mean().item() if n else 0.0,
            "policy/logp_abs_diff_mean": diff.mean().item() if diff.numel() else 0.0,
            "policy/logp_abs_diff_max": diff.max().item() if diff.numel() else 0.0,
            "policy/logp_abs_diff_p99": torch.quantile(diff.double(), 0.99).item() if diff.numel() else 0.0,
            "rollout/version_lag_mean": lag.mean().item() if n else 0.0,
            "rollout/version_lag_max": lag.max().item() if n else 0.0,
        })
    return metrics


# trainer.algo.losses' diagnostics, logged as policy/<name>: renamed here; None: not logged (= rollout/action_tokens)
_LOSS_NAMES = {"dis_masked_low_frac": "dis_masked_low", "dis_masked_high_frac": "dis_masked_high",
               "dis_kept_frac": "dis_kept", "num_kept_tokens": "dis_kept_tokens", "ppo_clip_frac": "clip_frac",
               "num_action_tokens": None}


def _policy_metrics(loss_metrics: dict[str, float]) -> dict[str, float]:
    """The policy loss's metrics under their logged names, plus policy/dis_masked (low + high) for DIS."""
    out = {f"policy/{_LOSS_NAMES.get(k, k)}": v for k, v in loss_metrics.items() if _LOSS_NAMES.get(k, k)}
    if "policy/dis_masked_low" in out:
        out["policy/dis_masked"] = out["policy/dis_masked_low"] + out["policy/dis_masked_high"]
    return out


def _stats(x: torch.Tensor, prefix: str) -> dict[str, float]:
    vals = x.float()
    if vals.numel() == 0:
        return {f"{prefix}_mean": 0.0, f"{prefix}_std": 0.0}
    return {f"{prefix}_mean": vals.mean().item(), f"{prefix}_std": vals.std(unbiased=False).item()}
