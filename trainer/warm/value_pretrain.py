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

Which path trains:
    runtime.world_size = 1   this process: load_backbone_critic, pretrain_critic
    runtime.world_size > 1   that many FSDP2 data-parallel ranks, the path `sao train`'s ranks run (local
                             processes, trainer.dist.distributed.spawn; value_pretrain.device=cuda: rank r on
                             cuda:r): the critic sharded from the start (build_sharded_critic, through the
                             same initial_critic), the same pretrain_critic loop with each rank on its
                             token-balanced part of every batch, the loss divided by all ranks' action
                             tokens, every metric the whole batch's; critic/ streamed from the shards in
                             save_critic's format (distributed.write_critic). Nothing of this stage is
                             missing there.
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

from sao_harness.core.errors import UserError
from sao_harness.core.files import atomic_dir
from sao_harness.harness.tiny_model import resolve_model_path
from sao_harness.harness.trace import Trajectory
from sao_harness.trainer.algo.batch import TrajectoryBatch, build_batch, micro_batches, pack
from sao_harness.trainer.algo.gae import skip_observation_gae
from sao_harness.trainer.algo.losses import explained_variance, value_loss
from sao_harness.trainer.config import TrainerConfig, ValuePretrainConfig
from sao_harness.trainer.dist import distributed, sharded
from sao_harness.trainer.modeling.critic_init import freeze_critic, load_backbone_critic
from sao_harness.trainer.modeling.models import Critic, save_critic, use_packed_attention
from sao_harness.trainer.modeling.precision import (
    autocast,
    enable_activation_checkpointing,
    model_dtype,
    to_master_weights,
    train_mode,
)
from sao_harness.trainer.report.metrics import METRICS_FILE, TB_DIR, MetricsLogger
from sao_harness.trainer.warm.corpus import Corpus, read_corpus

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


# --- one pass over a batch ----------------------------------------------------------------------

def _critic_pass(critic: Critic, batch: TrajectoryBatch, groups: list[list[int]], returns: torch.Tensor,
                 device: torch.device, backward: bool, dtype: torch.dtype,
                 normalizer: float) -> tuple[float, torch.Tensor]:
    """Value loss (the sum over the batch's action tokens / normalizer) and values [B, T] (CPU, detached)
    of one forward per micro-batch (`groups`: trainer.algo.batch.micro_batches); with backward=True the
    gradients of that loss accumulate in the critic. Forwards under autocast to `dtype` (the model
    dtype) on packed micro-batches, as SAOTrainer's."""
    values = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
    total = 0.0
    for rows in groups:
        mb = pack(batch, rows).to(device)
        with torch.set_grad_enabled(backward), autocast(device, dtype):
            v = critic(mb.input_ids, position_ids=mb.position_ids)
            loss = value_loss(v, mb.gather(returns), mb.action_mask, normalizer=normalizer)
        if backward:
            loss.backward()
        total += loss.item()
        mb.scatter(v, values)
    return total, values


def _pass(critic: Critic, trajectories: list[Trajectory], trainer: TrainerConfig, pad_token_id: int,
          device: torch.device, dtype: torch.dtype, backward: bool,
          dp: distributed.DataParallel | None = None) -> tuple[float, torch.Tensor, torch.Tensor]:
    """One pass of the critic over `trajectories` -> (value loss: token mean over their action tokens,
    V and G at those tokens, 1-D); with backward=True the loss's gradients accumulate in the critic.
    Under `dp` (every rank calls, with the same trajectories) this rank runs its token-balanced part
    (distributed.split), divides by the action tokens of all parts, pads its forwards up to the ranks'
    most, and the three are the whole batch's."""
    use_packed_attention(critic.backbone, trainer.attn_impl)  # idempotent: the packed rows' attention
    mine = trajectories if dp is None else distributed.split(trajectories, dp.world_size)[dp.rank]
    batch = build_batch(mine, pad_token_id) if mine else None
    groups = micro_batches(batch, trainer.max_tokens_per_microbatch) if mine else []
    n = sum(t.num_action_tokens for t in mine)
    if dp is not None:
        n, most = dp.sum(n), dp.max(len(groups))  # before the passes: FSDP's collectives pair up pass for pass
    loss, v, g = 0.0, torch.zeros(0), torch.zeros(0)
    if mine:
        returns = monte_carlo_returns(batch, trainer.gamma)
        loss, values = _critic_pass(critic, batch, groups, returns, device, backward, dtype, max(n, 1))
        v, g = values[batch.action_mask], returns[batch.action_mask]
    if dp is not None:
        dp.zero_passes(critic, most - len(groups), pad_token_id, device, dtype, backward)
        loss = dp.sum(loss)
        parts = dp.gather((v, g))
        v, g = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    return loss, v, g


def _explained_variance(v: torch.Tensor, g: torch.Tensor) -> float:
    return explained_variance(v[None], g[None], torch.ones(1, v.numel(), dtype=torch.bool))


@torch.no_grad()
def evaluate(critic: Critic, trajectories: list[Trajectory], trainer: TrainerConfig, pad_token_id: int = 0,
             device: str | torch.device = "cpu", batch_size: int = 16, dtype: torch.dtype | None = None,
             dp: distributed.DataParallel | None = None) -> dict[str, float]:
    """Value loss and explained variance of the critic on `trajectories` (no update), `batch_size` of them
    per pass (under `dp`: split over the ranks); forwards under autocast to `dtype` (default: the
    critic's model dtype), in train mode as every pass."""
    device, dtype = torch.device(device), dtype or model_dtype(critic)
    train_mode(critic)
    err, all_v, all_g = 0.0, [torch.zeros(0)], [torch.zeros(0)]
    for start in range(0, len(trajectories), batch_size):
        loss, v, g = _pass(critic, trajectories[start:start + batch_size], trainer, pad_token_id, device, dtype,
                           False, dp)
        err += loss * v.numel()
        all_v.append(v)
        all_g.append(g)
    v, g = torch.cat(all_v), torch.cat(all_g)
    if not v.numel():
        return {"value_loss": float("nan"), "explained_variance": float("nan")}
    return {"value_loss": err / v.numel(), "explained_variance": _explained_variance(v, g)}


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
                    pad_token_id: int = 0, verbose: bool = True, dp: distributed.DataParallel | None = None,
                    dtype: torch.dtype | None = None) -> PretrainResult:
    """Regress `critic` (in place) on the Monte-Carlo returns of `trajectories` (see the module docstring).

    Precision as SAOTrainer's (trainer.modeling.precision): the critic becomes fp32 master weights on
    `vp.device` that AdamW updates; every forward runs under autocast in the dtype it was loaded in.
    Data parallel (`dp`, every rank calls): `critic` is this rank's FSDP2 shard (build_sharded_critic:
    fp32 masters on the rank's device already; `dtype` the model dtype); every rank draws the same
    batches and trains on its part of each (`_pass`), so every metric, and the plateau stop, is the
    same on every rank.
    """
    if not trajectories:
        raise ValueError("trajectories: an empty corpus, nothing to pretrain on")
    dtype = dtype or model_dtype(critic)
    if dp is None:
        device = torch.device(vp.device)
        to_master_weights(critic).to(device)
    else:
        device = dp.device
    freeze_critic(critic, trainer)
    params = [p for p in critic.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=vp.lr, weight_decay=trainer.weight_decay)
    rng = random.Random(seed)
    eval_set = rng.sample(trajectories, min(vp.eval_trajectories, len(trajectories)))
    before = evaluate(critic, eval_set, trainer, pad_token_id, device, dtype=dtype, dp=dp) if eval_set else {}
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
        train_mode(critic)  # as in SAOTrainer: activation checkpointing active, no dropout allowed
        optimizer.zero_grad(set_to_none=True)
        loss, values, returns = _pass(critic, [trajectories[i] for i in rows], trainer, pad_token_id, device,
                                      dtype, True, dp)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, trainer.max_grad_norm))
        optimizer.step()
        ev = _explained_variance(values, returns)
        metrics = {"loss/value_loss": loss, "critic/explained_variance": ev, "critic/grad_norm": grad_norm,
                   "critic/lr": vp.lr, "time/epoch": float(epoch), "rollout/trajectories": float(len(rows)),
                   "rollout/action_tokens": float(values.numel()), "critic/return_mean": returns.mean().item()}
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
    after = evaluate(critic, eval_set, trainer, pad_token_id, device, dtype=dtype, dp=dp) if eval_set else {}
    return PretrainResult(steps=len(history), stop_reason=stop_reason, history=history, before=before, after=after)


# --- the stage ----------------------------------------------------------------------------------

def world_size(cfg) -> int:
    """The data-parallel ranks `sao value-pretrain` runs on (the one place this module reads it)."""
    return cfg.runtime.world_size


def _pretrain_rank(rank: int, world: int, address, cfg, model_path: str, trajectories: list[Trajectory],
                   devices: list[str], out: Path, verbose: bool) -> PretrainResult | None:
    """One rank of the distributed stage: the sharded critic, pretrain_critic on its parts, critic/
    streamed from the shards; rank 0 logs, prints and returns the result."""
    dp = distributed.DataParallel(rank, world, address, devices[rank])
    logger = MetricsLogger(out) if rank == 0 else None
    try:
        critic = distributed.build_sharded_critic(cfg.trainer, model_path, cfg.model.dtype, dp,
                                                  offload=cfg.runtime.offload_optimizer)
        pad = getattr(critic.backbone.config, "pad_token_id", None) or 0
        result = pretrain_critic(critic, trajectories, cfg.value_pretrain, cfg.trainer, logger, seed=cfg.run.seed,
                                 pad_token_id=pad, verbose=verbose and rank == 0, dp=dp,
                                 dtype=getattr(torch, cfg.model.dtype))
        if rank == 0:
            atomic_dir(out / CHECKPOINT_DIR, lambda tmp: distributed.write_critic(tmp, critic))
        else:
            distributed.write_critic(out / CHECKPOINT_DIR, critic)  # the collective gathers; rank 0 writes
    finally:
        if logger is not None:
            logger.close()
        dp.close()
    return result if rank == 0 else None


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
    world = world_size(cfg)
    devices = distributed.rank_devices(vp.device, world, "value_pretrain.device") if world > 1 else None
    # one process: the critic itself; ranks: its architecture (the meta device), to fail fast here
    critic = (load_backbone_critic(model_path, cfg.model.dtype) if world == 1
              else Critic.from_policy(sharded.meta_causal_lm(model_path)))
    try:
        freeze_critic(critic, trainer)
    except ValueError as e:
        raise UserError(f"trainer.critic_freeze: {e}") from None

    out = run / OUT_DIR
    out.mkdir(parents=True, exist_ok=True)
    (out / METRICS_FILE).unlink(missing_ok=True)  # a fresh stage: the curves of this run only
    shutil.rmtree(out / TB_DIR, ignore_errors=True)
    checkpoint = (out / CHECKPOINT_DIR).resolve()
    if world > 1:
        if verbose:
            print(f"value pretraining on {world} FSDP2 ranks ({distributed.backend(devices[0])}) on "
                  f"{', '.join(devices)}", flush=True)
        result = distributed.spawn(world, _pretrain_rank, cfg, model_path, corpus.trajectories, devices,
                                   out.resolve(), verbose)[0]
    else:
        if trainer.gradient_checkpointing:
            enable_activation_checkpointing(critic.backbone)
        pad = getattr(critic.backbone.config, "pad_token_id", None) or 0
        with MetricsLogger(out) as logger:
            result = pretrain_critic(critic, corpus.trajectories, vp, trainer, logger, seed=cfg.run.seed,
                                     pad_token_id=pad, verbose=verbose)
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
