"""Data-parallel SAO on torch.distributed FSDP2: `runtime.world_size` processes, one update.

    every rank   gets the whole batch, selects as SAOTrainer does, trains on its part: near-equal
                 token counts by greedy balancing (`split`; grpo: whole task groups, per-group advantages)
    global       the token counts N of the loss normalisers, whitening's mean and std, the running-mean
                 baseline (all_reduce / all_gather through `DataParallel`, the trainer's `dist` hook)
    gradients    each rank's loss is sum / N_global, FSDP reduce-scatters the *sum* over ranks (divide
                 factor 1), so the gradient is the single-process gradient of the whole batch
    balance      FSDP's collectives pair up only if every rank runs the same passes: a rank with fewer
                 micro-batches runs zero-loss passes on a 2-token input up to the ranks' most
    rank 0       the metrics (sums and token-weighted means reduced), the gathered full state dict
                 (the weights to publish)

Build (`build_sharded`, what `sao train` ranks run): the policy and the critic on the meta device,
fully_shard per decoder layer + a root, each rank's shards read from the safetensors (trainer.dist.sharded):
no rank holds a whole model. Mixed precision: fp32 master shards and AdamW states, the all-gathered
parameters in the model dtype, gradients reduced in fp32 (the value head all in fp32); optionally
the masters and AdamW on the CPU (`runtime.offload_optimizer`). Checkpoints: every rank writes its
shards (trainer.dist.checkpoint.save_sharded_checkpoint).

The warm-start stages run on the same path with world_size > 1 (local `spawn` processes):
`sao sft` (trainer.warm.sft_dist: build_sharded_policy) and `sao value-pretrain` (trainer.warm.value_pretrain:
build_sharded_critic, critic/ streamed by write_critic).

Process group: gloo on CPU, NCCL on GPU, a TCP store at `address` (127.0.0.1 locally, the driver's
node address on a cluster). Ranks start as Ray actors (`start_ranks`) or processes (`spawn`).
An update with fewer usable trajectories (grpo: task groups) than ranks is skipped on every rank.
"""
from __future__ import annotations

import json
import pickle
import socket
import struct
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from sao_harness.core.errors import UserError
from sao_harness.harness.config import SamplingConfig
from sao_harness.harness.trace import Status, Trajectory
from sao_harness.trainer.dist import sharded
from sao_harness.trainer.dist.checkpoint import (
    POLICY_MASTER,
    is_sharded,
    read_state,
    restore_optimizers,
    restore_rank_rng,
    save_sharded_checkpoint,
)
from sao_harness.trainer.config import TrainerConfig
from sao_harness.trainer.modeling.critic_init import freeze_critic, initial_critic
from sao_harness.trainer.modeling.models import CRITIC_WEIGHTS, Critic, load_critic
from sao_harness.trainer.modeling.precision import autocast
from sao_harness.trainer.algo.sao import SAOTrainer


def backend(device: torch.device | str) -> str:
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class DataParallel:
    """The process group of one rank and the global reductions the update needs."""

    def __init__(self, rank: int, world_size: int, address: tuple[str, int], device: str = "cpu",
                 timeout_s: float = 600.0):
        from torch.distributed.device_mesh import init_device_mesh  # lazy: torch.distributed piece

        self.rank, self.world_size, self.device = rank, world_size, torch.device(device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        host, port = address
        dist.init_process_group(backend(self.device), init_method=f"tcp://{host}:{port}", rank=rank,
                                world_size=world_size, timeout=timedelta(seconds=timeout_s))
        self.mesh = init_device_mesh(self.device.type, (world_size,))

    def _reduce(self, values: list[float], op=dist.ReduceOp.SUM) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=op)
        return t.tolist()

    def sum(self, x: float) -> float:
        return self._reduce([float(x)])[0]

    def max(self, x: int) -> int:
        return int(self._reduce([float(x)], dist.ReduceOp.MAX)[0])

    def reduce_max(self, values: list[float]) -> list[float]:
        return self._reduce([float(v) for v in values], dist.ReduceOp.MAX)

    def gather(self, obj) -> list:
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def whiten(self, advantages: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
        """losses.whiten_advantages with the mean and std over every rank's action tokens."""
        vals = advantages[mask].double()
        n = self.sum(vals.numel())
        if n == 0:
            return torch.zeros_like(advantages, dtype=torch.float32)
        mean = self.sum(vals.sum().item()) / n
        std = (self.sum(((vals - mean) ** 2).sum().item()) / n) ** 0.5
        return torch.where(mask, (advantages.float() - mean) / (std + eps), 0.0)

    def zero_passes(self, module: nn.Module, count: int, pad_token_id: int, device: torch.device,
                    dtype: torch.dtype, backward: bool = False) -> None:
        """`count` zero-loss passes of `module` (a Critic, or a causal LM's LogprobView) on a 2-token input:
        what a rank runs after its own passes to reach the ranks' most. Ask `max` for that most before
        any pass: a rank still in its own passes waits in FSDP's all-gather, not in an all_reduce."""
        ids = torch.full((1, 2), pad_token_id, dtype=torch.long, device=device)
        mask = torch.ones_like(ids, dtype=torch.bool)
        for _ in range(count):
            with torch.set_grad_enabled(backward), autocast(device, dtype):
                if isinstance(module, Critic):
                    out = module(ids, mask)
                else:
                    hidden = module.base_model(input_ids=ids, attention_mask=mask.long()).last_hidden_state
                    out = hidden @ module.get_output_embeddings().weight.T
            if backward:
                (out.float().sum() * 0.0).backward()

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


class GlobalBaseline:
    """A RunningMeanBaseline fed the whole batch in rank order (= the batch's order): every rank
    keeps the same windows and gets its slice's advantages."""

    def __init__(self, baseline, dp: DataParallel):
        self.baseline, self.dp = baseline, dp

    def advantages(self, task_ids: list[str], rewards) -> torch.Tensor:
        parts = self.dp.gather((list(task_ids), [float(r) for r in rewards]))
        adv = self.baseline.advantages([t for ids, _ in parts for t in ids], [r for _, rs in parts for r in rs])
        start = sum(len(ids) for ids, _ in parts[:self.dp.rank])
        return adv[start:start + len(task_ids)]

    def __getattr__(self, name):  # state_dict / load_state_dict / baseline for checkpoints
        return getattr(self.baseline, name)


class LogprobView(nn.Module):
    """What policy_token_logprobs reads from a causal LM, with the base model's call as the FSDP root
    forward: it unshards the embeddings, final norm and LM head (whose weight is read, not called)
    and keeps them until the backward."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm, self.config = lm, lm.config

    def base_model(self, **kwargs):
        return self.lm.base_model(**kwargs)

    def get_output_embeddings(self) -> nn.Module:
        return self.lm.get_output_embeddings()

    def set_attn_implementation(self, implementation: str) -> None:
        self.lm.set_attn_implementation(implementation)


def _fsdp(root: nn.Module, layers: nn.ModuleList, mesh, dtype: torch.dtype = torch.float32, offload: bool = False,
          fp32_modules: tuple[nn.Module, ...] = ()) -> nn.Module:
    """fully_shard each layer, each of `fp32_modules` (all-gathered in fp32), then the root. Mixed
    precision: fp32 shards, all-gathered in `dtype`, gradients reduce-scattered in fp32."""
    from torch.distributed.fsdp import (  # lazy: torch.distributed piece
        CPUOffloadPolicy,
        FSDPModule,
        MixedPrecisionPolicy,
        fully_shard,
    )

    def wrap(module, param_dtype):
        fully_shard(module, mesh=mesh, offload_policy=CPUOffloadPolicy() if offload else None,
                    mp_policy=MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32))

    for layer in layers:
        wrap(layer, dtype)
    for module in fp32_modules:
        wrap(module, torch.float32)
    wrap(root, dtype)
    for m in root.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)  # sum over ranks: each rank's loss is already / N_global
            m.set_force_sum_reduction_for_comms(True)  # plain SUM collectives (gloo has no PREMUL_SUM)
            m.set_reduce_scatter_unused_params(True)  # an expert unused on one rank still pairs up
    return root


def _shard_policy(lm: nn.Module, mesh, dtype: torch.dtype, offload: bool = False) -> LogprobView:
    from torch.distributed.fsdp import register_fsdp_forward_method  # lazy: torch.distributed piece

    view = _fsdp(LogprobView(lm), lm.base_model.layers, mesh, dtype, offload)
    register_fsdp_forward_method(view, "base_model")
    return view


def _shard_critic(critic: nn.Module, mesh, dtype: torch.dtype, offload: bool = False) -> nn.Module:
    return _fsdp(critic, critic.backbone.layers, mesh, dtype, offload, fp32_modules=(critic.value_head,))


def _check_world(cfg: TrainerConfig) -> None:
    if cfg.minibatches > 1:
        raise ValueError("runtime.world_size > 1 needs trainer.minibatches = 1 (a minibatch would be a slice "
                         "of each rank's part, not of the global batch)")


def shard(trainer: SAOTrainer, dp: DataParallel) -> SAOTrainer:
    """Shard an in-memory trainer's (fp32 master) policy and critic with fully_shard, per decoder layer
    plus a root, mixed precision in the trainer's dtype; rebuild the optimizers on the sharded
    parameters and install the global hooks (tests; `sao train` ranks run `build_sharded`)."""
    cfg = trainer.config
    _check_world(cfg)
    trainer.policy = _shard_policy(trainer.policy, dp.mesh, trainer.dtype)
    trainer.policy_params = [p for p in trainer.policy.parameters() if p.requires_grad]
    trainer.policy_optimizer = torch.optim.AdamW(trainer.policy_params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if trainer.critic is not None:
        _shard_critic(trainer.critic, dp.mesh, trainer.dtype)
        trainer.critic_params = [p for p in trainer.critic.parameters() if p.requires_grad]
        trainer.critic_optimizer = torch.optim.AdamW(trainer.critic_params, lr=cfg.critic_lr,
                                                     weight_decay=cfg.weight_decay)
    return _distributed(trainer, dp)


def _distributed(trainer: SAOTrainer, dp: DataParallel) -> SAOTrainer:
    if trainer.baseline is not None:
        trainer.baseline = GlobalBaseline(trainer.baseline, dp)
    trainer.dist = dp
    return trainer


def _critic_weights(cfg: TrainerConfig, model_path: str, ckpt, critic: nn.Module, base_prefix: str):
    """Where a sharded critic's weights come from (None: the checkpoint's DCP state) and whether its
    value head starts at zero: the old checkpoint format's critic/, the value-pretraining checkpoint,
    or the policy's own backbone weights (the file's "model." for the critic's "backbone.")."""
    if ckpt is not None:
        return (None, False) if is_sharded(ckpt) else (sharded.SafetensorsSource(ckpt / "critic"), False)
    if cfg.value_pretrain_checkpoint:
        return sharded.SafetensorsSource(cfg.value_pretrain_checkpoint), False
    rename = lambda n: base_prefix + n.removeprefix("backbone")
    return sharded.SafetensorsSource(model_path, rename, sharded.conversions(critic.backbone)), True


def build_sharded(cfg: TrainerConfig, model_path: str, dtype: str, dp: DataParallel, ckpt=None,
                  seed: int = 0, sampling: SamplingConfig | None = None, offload: bool = False) -> SAOTrainer:
    """The SAOTrainer of one rank, sharded from the start, fresh from `model_path` or resumed from `ckpt`
    (either checkpoint format, any world size); logprobs under `sampling`, the fp32 shards and AdamW on
    the CPU with `offload` (runtime.offload_optimizer):
        meta build   policy = model_path's (or ckpt's policy/) architecture; critic = initial_critic(policy)
                     (resumed: the policy's, or the old format's critic/ architecture), frozen as
                     trainer.critic_freeze* says
        shard        fully_shard per decoder layer + root, mixed precision, to_empty: the shards alone
        weights      the policy's from model_path (fresh), the old format's fp32 masters, or DCP; the
                     critic's as `_critic_weights` says
        RNG          seeded with `seed`; resumed: this rank's RNG states from `ckpt` where it has them
                     (trainer.dist.checkpoint.restore_rank_rng), so it draws what the uninterrupted rank would
    """
    _check_world(cfg)
    torch.manual_seed(seed)  # the loop's seed, as in one process
    compute = getattr(torch, dtype)
    lm = sharded.meta_causal_lm(ckpt / "policy" if ckpt else model_path)
    critic = None
    if cfg.advantage == "gae":
        if ckpt is None:
            critic = initial_critic(cfg, lm)
        elif is_sharded(ckpt):  # the policy's architecture; the weights are in dcp/
            critic = Critic.from_policy(lm)
        else:
            critic = load_critic(ckpt / "critic", weights=False)
        freeze_critic(critic, cfg)
    above = None if cfg.gradient_checkpointing else cfg.checkpoint_above_tokens
    if cfg.gradient_checkpointing or above is not None:
        for model in (lm, critic.backbone if critic is not None else None):
            if model is not None:
                sharded.checkpoint_layers(model, above)
    home = torch.device("cpu") if offload else dp.device  # where the fp32 shards live
    policy = _shard_policy(lm, dp.mesh, compute, offload)
    sharded.materialize(policy, home, [lm])
    if ckpt is None:
        sharded.load_parameters(lm, sharded.SafetensorsSource(model_path, converters=sharded.conversions(lm)))
    elif not is_sharded(ckpt):  # the old format: the fp32 masters (or, older, policy/ in the model dtype)
        master = ckpt / POLICY_MASTER
        sharded.load_parameters(lm, sharded.SafetensorsSource(master) if master.is_file() else
                                sharded.SafetensorsSource(ckpt / "policy", converters=sharded.conversions(lm)))
    if critic is not None:
        _shard_critic(critic, dp.mesh, compute, offload)
        sharded.materialize(critic, home, [critic.backbone])
        source, zero_head = _critic_weights(cfg, model_path, ckpt, critic, lm.base_model_prefix)
        if source is not None:
            sharded.load_parameters(critic, source, skip=("value_head.",) if zero_head else ())
        if zero_head:
            with torch.no_grad():
                for p in critic.value_head.parameters():
                    p.zero_()
    # SAOTrainer moves the modules to its device and turns on checkpointing: both done here already
    trainer = SAOTrainer(policy, critic, cfg.model_copy(update={"gradient_checkpointing": False}), dtype=compute,
                         sampling=sampling, device=home)
    trainer.config, trainer.device = cfg, dp.device
    _distributed(trainer, dp)
    if ckpt is not None:
        restore_optimizers(ckpt, trainer)
        state = read_state(ckpt)
        for key in ("policy_version", "updates", "critic_optimizer_steps", "policy_optimizer_steps"):
            setattr(trainer, key, state[key])
        restore_rank_rng(ckpt, dp.rank)  # last: the build above draws nothing the resumed run would not
    return trainer


def split(kept: list[Trajectory], world_size: int, by_task: bool = False) -> list[list[Trajectory]]:
    """One part per rank, of near-equal token counts (greedy balancing, longest processing time first).

    Units are the trajectories (by_task: each task's whole group, as GRPO's advantages are per group).
    Longest unit first (ties: batch order), each goes to the rank with the fewest tokens so far (ties:
    fewer units, then the lower rank), so the ranks' token counts differ by at most one unit. Each
    part is in batch order. Deterministic: every rank computes the same parts from the same batch.
    """
    units: dict[str, list[int]] = {}
    for i, t in enumerate(kept):
        units.setdefault(t.task_id if by_task else str(i), []).append(i)
    groups = list(units.values())
    parts = token_parts([sum(kept[i].num_tokens for i in g) for g in groups], world_size)
    return [[kept[i] for i in sorted(i for u in part for i in groups[u])] for part in parts]


def token_parts(tokens: list[int], world_size: int) -> list[list[int]]:
    """The indices of `tokens` (each unit's token count) in `world_size` parts of near-equal sums, as
    `split` balances them: longest first (ties: index order), each to the part with the fewest tokens
    so far (ties: fewer units, then the lower rank); each part sorted."""
    owned: list[list[int]] = [[] for _ in range(world_size)]
    sums, count = [0] * world_size, [0] * world_size
    for u in sorted(range(len(tokens)), key=lambda u: -tokens[u]):  # stable
        r = min(range(world_size), key=lambda r: (sums[r], count[r], r))
        owned[r].append(u)
        sums[r] += tokens[u]
        count[r] += 1
    return [sorted(part) for part in owned]


def full_state_dict(module: nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    """The sharded module's full state dict on CPU, on rank 0 ({} elsewhere); every rank must call."""
    sd = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k.removeprefix(prefix): v for k, v in sd.items()}


# --- the warm-start stages on the same ranks (`sao sft`, `sao value-pretrain`) --------------------

def rank_devices(device: str, world_size: int, key: str) -> list[str]:
    """The device of each local rank (`spawn`): "cpu" for every rank, or for "cuda" rank r on its own GPU
    "cuda:r". Another device (e.g. "cuda:1") is a UserError naming `key`."""
    if device == "cpu":
        return ["cpu"] * world_size
    if device != "cuda":
        raise UserError(f"{key}={device!r}: with world_size {world_size} name the kind, 'cpu' or 'cuda' "
                        "(rank r runs on cuda:r)")
    if torch.cuda.device_count() < world_size:
        raise UserError(f"{key}='cuda' with world_size {world_size} needs {world_size} GPUs, "
                        f"{torch.cuda.device_count()} visible")
    return [f"cuda:{r}" for r in range(world_size)]


def _checkpointing(model: nn.Module, always: bool, above: int | None) -> None:
    """Activation checkpointing per decoder layer as build_sharded sets it: always, in a forward of more
    than `above` tokens, or (neither) off."""
    if always or above is not None:
        sharded.checkpoint_layers(model, None if always else above)


def build_sharded_policy(model_path: str, dtype: str, dp: DataParallel, *, always_checkpoint: bool = False,
                         checkpoint_above: int | None = None, offload: bool = False) -> LogprobView:
    """`model_path`'s causal LM on this rank, sharded from the start as build_sharded's fresh policy: the
    meta build, fully_shard per decoder layer + root (fp32 master shards, all-gathered in `dtype`), this
    rank's shards read from the safetensors (on the CPU with `offload`)."""
    lm = sharded.meta_causal_lm(model_path)
    _checkpointing(lm, always_checkpoint, checkpoint_above)
    view = _shard_policy(lm, dp.mesh, getattr(torch, dtype), offload)
    sharded.materialize(view, torch.device("cpu") if offload else dp.device, [lm])
    sharded.load_parameters(lm, sharded.SafetensorsSource(model_path, converters=sharded.conversions(lm)))
    return view


def build_sharded_critic(cfg: TrainerConfig, model_path: str, dtype: str, dp: DataParallel, *,
                         offload: bool = False) -> Critic:
    """`sao value-pretrain`'s critic on this rank, sharded from the start as build_sharded's fresh critic:
    initial_critic of model_path's meta policy (its base model, value head at zero; never
    trainer.value_pretrain_checkpoint), frozen as trainer.critic_freeze* says, checkpointed as
    trainer.gradient_checkpointing / checkpoint_above_tokens say, this rank's shards read from
    `model_path` (the file's "model." for the critic's "backbone.")."""
    cfg = cfg.model_copy(update={"value_pretrain_checkpoint": None})
    lm = sharded.meta_causal_lm(model_path)
    critic = initial_critic(cfg, lm)
    freeze_critic(critic, cfg)
    _checkpointing(critic.backbone, cfg.gradient_checkpointing, cfg.checkpoint_above_tokens)
    _shard_critic(critic, dp.mesh, getattr(torch, dtype), offload)
    sharded.materialize(critic, torch.device("cpu") if offload else dp.device, [critic.backbone])
    source, _ = _critic_weights(cfg, model_path, None, critic, lm.base_model_prefix)
    sharded.load_parameters(critic, source, skip=("value_head.",))
    with torch.no_grad():
        for p in critic.value_head.parameters():
            p.zero_()
    return critic


def write_critic(directory: str | Path, critic: Critic) -> None:
    """models.save_critic's format (config.json + critic.safetensors: every weight under the module's
    name, in its master dtype) of a sharded critic, streamed: the safetensors header first (the shapes
    are known), then every tensor gathered (full_tensor: a collective, every rank calls) and appended by
    rank 0, so no rank holds more than one full tensor."""
    from torch.distributed.tensor import DTensor  # lazy: torch.distributed piece

    directory = Path(directory)
    tensors = list(critic.state_dict(keep_vars=True).items())
    header, offset = {}, 0
    for name, t in tensors:
        size = t.numel() * t.element_size()
        header[name] = {"dtype": sharded.SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header | {"__metadata__": {"format": "pt"}}, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    out = None
    if sharded.rank() == 0:
        directory.mkdir(parents=True, exist_ok=True)
        critic.backbone.config.save_pretrained(directory)
        out = open(directory / CRITIC_WEIGHTS, "wb")  # noqa: SIM115 - closed below, after every tensor
        out.write(struct.pack("<Q", len(blob)) + blob)
    try:
        for _, t in tensors:
            full = t.detach().full_tensor() if isinstance(t, DTensor) else t.detach()
            if out is not None:
                out.write(full.cpu().contiguous().view(torch.uint8).numpy().tobytes())
    finally:
        if out is not None:
            out.close()


# --- one rank, and how ranks start --------------------------------------------------------------

class RankTrainer:
    """One data-parallel rank: the process group and its sharded SAOTrainer, `build(dp)`: a trainer
    sharded already (`build_sharded`), or an in-memory one with the same weights on every rank,
    sharded here."""

    def __init__(self, rank: int, world_size: int, address: tuple[str, int], build, device: str = "cpu"):
        self.dp = DataParallel(rank, world_size, address, device)
        trainer = build(self.dp)
        self.trainer = trainer if trainer.dist is not None else shard(trainer, self.dp)

    def update(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """One update on the global batch (every rank gets all of it); the metrics of the whole batch (the
        trainer's update reduces them over the ranks; the counts before the split are every rank's alike)."""
        trainer, world = self.trainer, self.dp.world_size
        kept, unrewarded, stale, broken = trainer._select(trajectories)
        parts = split(kept, world, by_task=trainer.config.advantage == "grpo")
        mine = parts[self.dp.rank] if all(parts) else []  # too few to go round: skipped on every rank
        metrics = trainer.update(mine)
        n_in = len(trajectories)
        infra = sum(t.status == Status.INFRA_ERROR for t in trajectories)
        metrics.update({"rollout/trajectories_in": float(n_in), "rollout/excluded_unrewarded": float(unrewarded),
                        "rollout/dropped_stale": float(stale), "rollout/infra_failure_rate": infra / max(n_in, 1),
                        "rollout/break_frac": broken / max(n_in, 1)})
        return metrics

    def policy_weights(self, dtype: torch.dtype | str | None = None) -> dict[str, torch.Tensor]:
        """The full policy state dict (rank 0; {} elsewhere), cast to `dtype` (the engine's) if given:
        gathered one tensor at a time, each cast before its gather (no whole fp32 copy anywhere)."""
        from torch.distributed.tensor import DTensor  # lazy: torch.distributed piece

        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        out = {}
        for name, t in self.trainer.policy.lm.state_dict().items():
            t = t.detach().to(dtype) if dtype is not None and t.is_floating_point() else t.detach()
            full = t.full_tensor() if isinstance(t, DTensor) else t
            if self.dp.rank == 0:
                out[name] = full.cpu()
        return out

    def save_checkpoint(self, run_dir, step: int, *, tokenizer=None, state: dict, keep: int, rng: dict | None = None):
        """checkpoint.save_sharded_checkpoint: every rank writes its shards and RNG states, rng.pt holds
        `rng` (the driver's) or rank 0's (rank 0: the path; None elsewhere)."""
        return save_sharded_checkpoint(run_dir, step, trainer=self.trainer, tokenizer=tokenizer, state=state,
                                       keep=keep, rng=rng)

    def counters(self) -> dict[str, int]:
        """This rank's trainer's counters (`SAOTrainer.state_dict`)."""
        return self.trainer.state_dict()

    def close(self) -> None:
        self.dp.close()


def start_ranks(world_size: int, build, device: str = "cpu", host: str = "127.0.0.1", num_gpus: float = 0):
    """`world_size` RankTrainer Ray actors (one per rank, Ray places them over the cluster's nodes;
    `host` is this node's address the others reach: rank 0 runs here). Returns the actor handles, rank
    order. Every call on them (update, policy_weights, save_checkpoint) goes to all ranks; rank 0 answers."""
    import ray  # lazy: heavy
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # lazy: part of ray

    port = free_port(host)
    actor = ray.remote(num_gpus=num_gpus)(RankTrainer)
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return [(actor.options(scheduling_strategy=here) if r == 0 else actor).remote(r, world_size, (host, port), build,
                                                                                 device)
            for r in range(world_size)]


def _spawned(rank: int, world_size: int, address, target, args, results) -> None:
    # plain pickle: tensors travel as bytes (torch's shared-memory handles die with this process)
    try:
        results.put((rank, pickle.dumps(target(rank, world_size, address, *args))))
    except BaseException as e:  # noqa: B036 - reported to the parent, which raises
        results.put((rank, pickle.dumps(RuntimeError(f"{type(e).__name__}: {e}"))))
        raise


def spawn(world_size: int, target, *args, timeout_s: float = 300.0) -> list:
    """Run `target(rank, world_size, address, *args)` in `world_size` fresh processes (torch
    multiprocessing, spawn) on 127.0.0.1; the return values in rank order."""
    import torch.multiprocessing as mp  # lazy: only the process starter needs it

    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    address = ("127.0.0.1", free_port())
    procs = [ctx.Process(target=_spawned, args=(r, world_size, address, target, args, results))
             for r in range(world_size)]
    for p in procs:
        p.start()
    out: dict = {}
    try:
        while len(out) < world_size:  # a failed rank ends the run at once: the others would wait in a collective
            if results.empty():  # a rank killed (OOM, a signal) reports nothing: ask the processes
                dead = [r for r, p in enumerate(procs) if r not in out and not p.is_alive()]
                if dead and results.empty():  # what a rank put before it exited is in the pipe by now
                    raise RuntimeError(f"rank {dead[0]} died (exit code {procs[dead[0]].exitcode}) without a result")
                time.sleep(0.05)
                continue
            rank, value = results.get()
            value = pickle.loads(value)
            if isinstance(value, BaseException):
                raise RuntimeError(f"rank {rank} failed: {value!r}") from value
            out[rank] = value
    finally:
        for p in procs:
            p.join(timeout_s if len(out) == world_size else 0)
            if p.is_alive():
                p.kill()
    return [out[r] for r in range(world_size)]
