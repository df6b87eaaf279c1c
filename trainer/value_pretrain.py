"""`sao value-pretrain`: regress the critic on Monte-Carlo returns of stored trajectories
(docs/algorithm.md section 4.5).

    corpus  = rewarded trajectories of every store in value_pretrain.traces (default <run>/traces),
              sampled by the initial policy (`sao rollout`); more stores = a larger corpus
    critic  = Critic.from_pretrained(model.path), frozen as trainer.critic_freeze* says
    G_k     = skip_observation_gae(V = 0, r, gamma, lambda = 1).returns        (Monte-Carlo return;
              gamma = 1: the reward R at every action token)
    repeat: AdamW step on 0.5 (V - G)^2, token mean over the action tokens of `batch_size` trajectories
    until:  neither the value loss nor the explained variance (EMAs, `smoothing`) improved by more
            than `min_delta` for `patience` steps ("plateau"), or `max_steps` ("budget")

Writes into <run>/value_pretrain/: metrics.jsonl + tb/ (loss/value_loss, critic/explained_variance,
critic/grad_norm, ... per step), summary.json, and the checkpoint critic/ (save_critic; replaced
whole, never half-written). `sao train` starts from it with
    trainer.value_pretrain_checkpoint=<run>/value_pretrain/critic
and the RL critic warm-up (trainer.critic_warmup_steps / critic_only_steps) still applies after it.
"""
from __future__ import annotations

import json
import math
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from core.errors import UserError
from core.files import atomic_dir
from harness.tiny_model import resolve_model_path
from harness.trace import Trajectory
from trainer.batch import TrajectoryBatch, build_batch, micro_batches, pack
from trainer.config import TrainerConfig, ValuePretrainConfig
from trainer.corpus import Corpus, read_corpus
from trainer.gae import skip_observation_gae
from trainer.losses import explained_variance, value_loss
from trainer.metrics import METRICS_FILE, TB_DIR, MetricsLogger
from trainer.models import (
    Critic,
    critic_freeze_patterns,
    freeze_parameters,
    load_critic,
    save_critic,
    use_packed_sdpa,
)
from trainer.precision import autocast, enable_activation_checkpointing, model_dtype, to_master_weights, train_mode

OUT_DIR = "value_pretrain"
CHECKPOINT_DIR = "critic"


# --- the corpus ---------------------------------------------------------------------------------

def _skip_reason(traj: Trajectory) -> str | None:
    if traj.reward is None:
        return "unrewarded"
    if traj.breaks:
        return "breaks"
    if traj.num_action_tokens == 0:
        return "no_action"
    return "action_first" if traj.is_action[0] else None


def load_corpus(paths: list[str | Path]) -> Corpus:
    """The trainable trajectories of every trace store in `paths` (run dir, traces dir or shard).

    Skipped and counted: no reward (infra / agent errors), `breaks`, no action token, an action
    token first, a traj_id already seen (the same store listed twice). Trajectories sampled by a
    policy version > 0 are kept and counted (`later_policy`): they are not the initial policy's.
    """
    corpus = read_corpus(paths, _skip_reason, ("unrewarded", "breaks", "no_action", "action_first"),
                         key="value_pretrain.traces")
    corpus.counts["later_policy"] = sum(bool(t.versions and t.versions[-1] > 0) for t in corpus.trajectories)
    return corpus


def monte_carlo_returns(batch: TrajectoryBatch, gamma: float = 1.0) -> torch.Tensor:
    """G [B, T]: the discounted sum of later rewards at every action token, 0 elsewhere.

    GAE with V = 0 and lambda = 1 is exactly the Monte-Carlo return; with gamma = 1 and the terminal
    reward on the last action token it is R at every action token of the trajectory.
    """
    zeros = torch.zeros(batch.rewards.shape, dtype=torch.float32)
    return skip_observation_gae(zeros, batch.rewards, batch.action_mask, gamma, 1.0)[1]


# --- the critic ---------------------------------------------------------------------------------

def freeze_critic(critic: Critic, trainer: TrainerConfig) -> list[str]:
    """Freeze the critic as `trainer.critic_freeze*` configures it (as SAOTrainer does); frozen names."""
    patterns = critic_freeze_patterns(trainer.critic_freeze, trainer.critic_freeze_norms,
                                      trainer.critic_freeze_router, trainer.critic_freeze_embeddings)
    return freeze_parameters(critic, patterns)


def load_backbone_critic(model_path: str, dtype: str = "float32") -> Critic:
    """Critic.from_pretrained(model_path) without transformers' load report (the policy's lm_head is
    expected to be left out); a backbone weight missing from the checkpoint is a UserError."""
    from transformers import AutoModel  # lazy: heavy
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        backbone, info = AutoModel.from_pretrained(model_path, dtype=getattr(torch, dtype), output_loading_info=True)
    except OSError as e:
        raise UserError(f"model.path: cannot load {model_path}: {str(e).splitlines()[0]}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    if info.get("missing_keys"):
        missing = sorted(info["missing_keys"])
        raise UserError(f"model.path: {model_path} lacks {len(missing)} backbone weights (e.g. {missing[0]}); "
                        "the critic would start from random weights")
    return Critic(backbone)


def initial_critic(trainer: TrainerConfig, policy: torch.nn.Module) -> Critic:
    """The critic `sao train` starts from: the value-pretraining checkpoint when
    `trainer.value_pretrain_checkpoint` is set (checked against the policy's architecture, cast to its
    dtype; value head fp32), else a fresh Critic.from_policy(policy). A policy on the meta device
    (trainer.distributed.build_sharded) gives a critic on the meta device: its weights are read later."""
    path = trainer.value_pretrain_checkpoint
    if path is None:
        return Critic.from_policy(policy)
    if not Path(path).is_dir():
        raise UserError(f"trainer.value_pretrain_checkpoint: directory not found: {path} "
                        "(run `sao value-pretrain` first)")
    try:
        critic = load_critic(path, weights=not next(policy.parameters()).is_meta)
    except (ValueError, OSError) as e:
        raise UserError(f"trainer.value_pretrain_checkpoint: {e}") from None
    mine, theirs = critic.backbone.config, policy.config
    for key in ("model_type", "hidden_size", "num_hidden_layers", "vocab_size"):
        if getattr(mine, key, None) != getattr(theirs, key, None):
            raise UserError(f"trainer.value_pretrain_checkpoint: {path} has {key}={getattr(mine, key, None)!r} "
                            f"but the policy has {getattr(theirs, key, None)!r} (pretrained from another model?)")
    critic.backbone.to(dtype=next(policy.parameters()).dtype)
    return critic


# --- one pass over a batch ----------------------------------------------------------------------

def _critic_pass(critic: Critic, batch: TrajectoryBatch, returns: torch.Tensor, max_tokens: int,
                 device: torch.device, backward: bool, dtype: torch.dtype) -> tuple[float, torch.Tensor]:
    """Value loss (token mean over the batch's action tokens) and values [B, T] (CPU, detached);
    with backward=True the gradients of that loss accumulate in the critic. Forwards under autocast
    to `dtype` (the model dtype) on packed micro-batches of <= max_tokens tokens, as SAOTrainer's."""
    n_action = max(int(batch.action_mask.sum()), 1)
    values = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
    total = 0.0
    use_packed_sdpa(critic.backbone)  # idempotent: SDPA per trajectory on packed rows
    for rows in micro_batches(batch, max_tokens):
        mb = pack(batch, rows).to(device)
        with torch.set_grad_enabled(backward), autocast(device, dtype):
            v = critic(mb.input_ids, position_ids=mb.position_ids)
            loss = value_loss(v, mb.gather(returns), mb.action_mask, normalizer=n_action)
        if backward:
            loss.backward()
        total += loss.item()
        mb.scatter(v, values)
    return total, values


@torch.no_grad()
def evaluate(critic: Critic, trajectories: list[Trajectory], trainer: TrainerConfig, pad_token_id: int = 0,
             device: str | torch.device = "cpu", batch_size: int = 16,
             dtype: torch.dtype | None = None) -> dict[str, float]:
    """Value loss and explained variance of the critic on `trajectories` (no update); forwards under
    autocast to `dtype` (default: the critic's model dtype), in train mode as every pass."""
    device, dtype = torch.device(device), dtype or model_dtype(critic)
    train_mode(critic)
    err, count, all_v, all_g = 0.0, 0, [], []
    for start in range(0, len(trajectories), batch_size):
        batch = build_batch(trajectories[start:start + batch_size], pad_token_id)
        returns = monte_carlo_returns(batch, trainer.gamma)
        n = int(batch.action_mask.sum())
        loss, values = _critic_pass(critic, batch, returns, trainer.max_tokens_per_microbatch, device, False, dtype)
        err, count = err + loss * n, count + n
        all_v.append(values[batch.action_mask])
        all_g.append(returns[batch.action_mask])
    if not count:
        return {"value_loss": float("nan"), "explained_variance": float("nan")}
    v, g = torch.cat(all_v), torch.cat(all_g)
    ev = explained_variance(v[None], g[None], torch.ones(1, v.numel(), dtype=torch.bool))
    return {"value_loss": err / count, "explained_variance": ev}


# --- the loop -----------------------------------------------------------------------------------

@dataclass
class PretrainResult:
    steps: int
    stop_reason: str  # "plateau" or "budget"
    history: list[dict]  # the per-step metrics
    before: dict[str, float] = field(default_factory=dict)  # evaluate() on the eval sample, before ...
    after: dict[str, float] = field(default_factory=dict)  # ... and after
    checkpoint: str | None = None
    corpus: dict[str, int] = field(default_factory=dict)


def _batches(n: int, batch_size: int, rng: random.Random):
    """Endless index batches: a fresh permutation per epoch, cut into `batch_size` chunks (the
    remainder of an epoch is dropped); a corpus smaller than a batch is one batch."""
    epoch = 0
    while True:
        order = list(range(n))
        rng.shuffle(order)
        size = min(batch_size, n)
        for start in range(0, n - size + 1, size):
            yield epoch, order[start:start + size]
        epoch += 1


class _Plateau:
    """Bias-corrected EMAs of value loss and explained variance; counts steps without an improvement
    by more than min_delta of either (nan explained variance, e.g. all returns equal, is skipped)."""

    def __init__(self, smoothing: float, min_delta: float):
        self.beta, self.min_delta = smoothing, min_delta
        self.ema = {"value_loss": [0.0, 0], "explained_variance": [0.0, 0]}
        self.best = {"value_loss": math.inf, "explained_variance": -math.inf}
        self.since = 0

    def _smooth(self, key: str, x: float) -> float | None:
        state = self.ema[key]
        if math.isfinite(x):
            state[0] = self.beta * state[0] + (1 - self.beta) * x
            state[1] += 1
        return state[0] / (1 - self.beta ** state[1]) if state[1] else None

    def update(self, loss: float, ev: float) -> dict[str, float]:
        loss_s, ev_s = self._smooth("value_loss", loss), self._smooth("explained_variance", ev)
        improved = False
        if loss_s is not None and loss_s < self.best["value_loss"] - self.min_delta:
            self.best["value_loss"], improved = loss_s, True
        if ev_s is not None and ev_s > self.best["explained_variance"] + self.min_delta:
            self.best["explained_variance"], improved = ev_s, True
        self.since = 0 if improved else self.since + 1
        out = {"critic/steps_since_improvement": float(self.since)}
        if loss_s is not None:
            out["loss/value_loss_smoothed"] = loss_s
        if ev_s is not None:
            out["critic/explained_variance_smoothed"] = ev_s
        return out


def pretrain_critic(critic: Critic, trajectories: list[Trajectory], vp: ValuePretrainConfig,
                    trainer: TrainerConfig, logger: MetricsLogger | None = None, seed: int = 0,
                    pad_token_id: int = 0, verbose: bool = True) -> PretrainResult:
    """Regress `critic` (in place) on the Monte-Carlo returns of `trajectories` (see the module docstring).

    Precision as SAOTrainer's (trainer.precision): the critic becomes fp32 master weights on
    `vp.device` that AdamW updates; every forward runs under autocast in the dtype it was loaded in.
    """
    if not trajectories:
        raise ValueError("trajectories: an empty corpus, nothing to pretrain on")
    device, dtype = torch.device(vp.device), model_dtype(critic)
    to_master_weights(critic).to(device)
    freeze_critic(critic, trainer)
    params = [p for p in critic.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=vp.lr, weight_decay=trainer.weight_decay)
    rng = random.Random(seed)
    eval_set = rng.sample(trajectories, min(vp.eval_trajectories, len(trajectories)))
    before = evaluate(critic, eval_set, trainer, pad_token_id, device, dtype=dtype) if eval_set else {}
    if verbose and before:
        print(f"value pretraining: {len(trajectories)} trajectories; before: value loss "
              f"{before['value_loss']:.4f}, explained variance {before['explained_variance']:.3f} "
              f"({len(eval_set)} sampled trajectories)")
    plateau = _Plateau(vp.smoothing, vp.min_delta)
    history: list[dict] = []
    stop_reason = "budget"
    batches = _batches(len(trajectories), vp.batch_size, rng)
    for step in range(1, vp.max_steps + 1):
        t0 = time.perf_counter()
        epoch, rows = next(batches)
        batch = build_batch([trajectories[i] for i in rows], pad_token_id)
        returns = monte_carlo_returns(batch, trainer.gamma)
        train_mode(critic)  # as in SAOTrainer: activation checkpointing active, no dropout allowed
        optimizer.zero_grad(set_to_none=True)
        loss, values = _critic_pass(critic, batch, returns, trainer.max_tokens_per_microbatch, device, True, dtype)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, trainer.max_grad_norm))
        optimizer.step()
        ev = explained_variance(values, returns, batch.action_mask)
        metrics = {"loss/value_loss": loss, "critic/explained_variance": ev, "critic/grad_norm": grad_norm,
                   "critic/lr": vp.lr, "time/epoch": float(epoch), "rollout/trajectories": float(len(rows)),
                   "rollout/action_tokens": float(batch.action_mask.sum()),
                   "critic/return_mean": returns[batch.action_mask].mean().item()}
        metrics.update(plateau.update(loss, ev))
        metrics["time/step_s"] = time.perf_counter() - t0
        history.append({"step": step, **metrics})
        if logger is not None:
            logger.log(step, metrics)
        if verbose and (step == 1 or step % 10 == 0):
            print(f"step {step} | value loss {loss:.4f} | EV {ev:.3f} | grad norm {grad_norm:.3f} | "
                  f"no improvement for {plateau.since}")
        if plateau.since >= vp.patience:
            stop_reason = "plateau"
            break
    after = evaluate(critic, eval_set, trainer, pad_token_id, device, dtype=dtype) if eval_set else {}
    return PretrainResult(steps=len(history), stop_reason=stop_reason, history=history, before=before, after=after)


def run_value_pretrain(cfg, verbose: bool = True) -> PretrainResult:
    """The whole stage for a validated Config: corpus, critic from model.path, loop, checkpoint, summary."""
    vp, trainer = cfg.value_pretrain, cfg.trainer
    run = Path(cfg.run.dir)
    try:
        device = torch.device(vp.device)
    except RuntimeError as e:
        raise UserError(f"value_pretrain.device: {e}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"value_pretrain.device={vp.device!r}, but no CUDA device is available")
    sources = list(vp.traces) or [str(run / "traces")]
    corpus = load_corpus(sources)
    c = corpus.counts
    if not corpus.trajectories:
        raise UserError(f"value pretraining: no trainable trajectory in {', '.join(sources)} ({c['read']} read: "
                        f"{c['unrewarded']} without a reward, {c['breaks']} with breaks, {c['no_action']} "
                        f"without action tokens)")
    if verbose:
        skipped = {k: v for k, v in c.items() if k not in ("read", "used", "later_policy") and v}
        print(f"corpus: {c['used']} of {c['read']} trajectories from {len(sources)} store(s)"
              + (f"; skipped {skipped}" if skipped else ""))
        if c["later_policy"]:
            print(f"note: {c['later_policy']} trajectories were sampled by a policy version > 0, not the "
                  "initial policy; their returns are another policy's")

    model_path = resolve_model_path(cfg.model)
    critic = load_backbone_critic(model_path, cfg.model.dtype)
    try:
        freeze_critic(critic, trainer)
    except ValueError as e:
        raise UserError(f"trainer.critic_freeze: {e}") from None
    if trainer.gradient_checkpointing:
        enable_activation_checkpointing(critic.backbone)
    pad = getattr(critic.backbone.config, "pad_token_id", None) or 0

    out = run / OUT_DIR
    out.mkdir(parents=True, exist_ok=True)
    (out / METRICS_FILE).unlink(missing_ok=True)  # a fresh stage: the curves of this run only
    shutil.rmtree(out / TB_DIR, ignore_errors=True)
    with MetricsLogger(out) as logger:
        result = pretrain_critic(critic, corpus.trajectories, vp, trainer, logger, seed=cfg.run.seed,
                                 pad_token_id=pad, verbose=verbose)
    checkpoint = (out / CHECKPOINT_DIR).resolve()
    atomic_dir(checkpoint, lambda tmp: save_critic(critic.cpu(), tmp))
    result.checkpoint, result.corpus = str(checkpoint), corpus.counts
    summary = {k: v for k, v in asdict(result).items() if k != "history"}
    summary.update(model=model_path, traces=sources, config=vp.model_dump(mode="json"))
    summary = json.loads(json.dumps(summary, default=str), parse_constant=lambda _: None)  # nan -> null
    (out / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n")

    if verbose:
        why = (f"plateau: no improvement > {vp.min_delta} for {vp.patience} steps" if result.stop_reason == "plateau"
               else f"budget: value_pretrain.max_steps={vp.max_steps}")
        print(f"stopped after {result.steps} steps ({why})")
        if result.before and result.after:
            print(f"value loss {result.before['value_loss']:.4f} -> {result.after['value_loss']:.4f}, "
                  f"explained variance {result.before['explained_variance']:.3f} -> "
                  f"{result.after['explained_variance']:.3f}")
        print(f"metrics: {out / METRICS_FILE} (plot: sao runs plot {run})")
        print(f"critic checkpoint: {checkpoint}")
        print(f"train from it with the override:  trainer.value_pretrain_checkpoint={checkpoint}")
    return result


def cmd_value_pretrain(args) -> int:
    """`sao value-pretrain --config ...` (args.cfg: the validated Config)."""
    run_value_pretrain(args.cfg)
    return 0
