"""Data-parallel SAO on torch.distributed FSDP2: `trainer.world_size` processes, one update.

    every rank   gets the whole batch, selects as SAOTrainer does, trains on its slice: contiguous
                 chunks of the kept trajectories (grpo: whole task groups, its advantages are per group)
    global       the token counts N of the loss normalisers, whitening's mean and std, the running-mean
                 baseline (all_reduce / all_gather through `DataParallel`, the trainer's `dist` hook)
    gradients    each rank's loss is sum / N_global, FSDP reduce-scatters the *sum* over ranks (divide
                 factor 1), so the gradient is the single-process gradient of the whole batch
    balance      FSDP's collectives pair up only if every rank runs the same passes: a rank with fewer
                 micro-batches runs zero-loss passes on a 2-token input up to the ranks' most
    rank 0       the metrics (sums and token-weighted means reduced), the gathered full state dicts
                 (the weights to publish; checkpoints in trainer/checkpoint.py's format)

Process group: gloo on CPU, NCCL on GPU, a TCP store at `address` (127.0.0.1 locally, the driver's
node address on a cluster). Ranks start as Ray actors (`start_ranks`) or processes (`spawn`).
An update with fewer usable trajectories (grpo: task groups) than ranks is skipped on every rank.
"""
from __future__ import annotations

import pickle
import socket
from datetime import timedelta
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from harness.trace import Trajectory
from trainer.models import Critic
from trainer.precision import autocast
from trainer.sao import SAOTrainer

SUMMED = ("value_loss", "value_loss_last_step", "trajectories", "micro_batches", "action_tokens", "tokens")
TOKEN_MEANS = ("policy_loss", "entropy", "logp_abs_diff_mean", "adv_raw_mean", "adv_mean", "value_mean",
               "return_mean")


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

    def balance(self, trainer: SAOTrainer, module: nn.Module, passes: int, backward: bool = False) -> None:
        """Zero-loss passes of `module` until this rank ran as many as the ranks' most."""
        ids = torch.full((1, 2), trainer.pad_token_id, dtype=torch.long, device=trainer.device)
        mask = torch.ones_like(ids, dtype=torch.bool)
        for _ in range(self.max(passes) - passes):
            with torch.set_grad_enabled(backward), autocast(trainer.device, trainer.dtype):
                if module is trainer.critic:
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


def _fsdp(root: nn.Module, layers: nn.ModuleList, mesh) -> nn.Module:
    from torch.distributed.fsdp import FSDPModule, fully_shard  # lazy: torch.distributed piece

    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(root, mesh=mesh)
    for m in root.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)  # sum over ranks: each rank's loss is already / N_global
            m.set_force_sum_reduction_for_comms(True)  # plain SUM collectives (gloo has no PREMUL_SUM)
            m.set_reduce_scatter_unused_params(True)  # an expert unused on one rank still pairs up
    return root


def shard(trainer: SAOTrainer, dp: DataParallel) -> SAOTrainer:
    """Shard the trainer's (fp32 master) policy and critic with fully_shard, per decoder layer plus
    a root, rebuild the optimizers on the sharded parameters and install the global hooks."""
    from torch.distributed.fsdp import register_fsdp_forward_method  # lazy: torch.distributed piece

    cfg = trainer.config
    if cfg.minibatches > 1:
        raise ValueError("trainer.world_size > 1 needs trainer.minibatches = 1 (a minibatch would be a slice "
                         "of each rank's part, not of the global batch)")
    view = _fsdp(LogprobView(trainer.policy), trainer.policy.base_model.layers, dp.mesh)
    register_fsdp_forward_method(view, "base_model")
    trainer.policy = view
    trainer.policy_params = [p for p in view.parameters() if p.requires_grad]
    trainer.policy_optimizer = torch.optim.AdamW(trainer.policy_params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if trainer.critic is not None:
        _fsdp(trainer.critic, trainer.critic.backbone.layers, dp.mesh)
        trainer.critic_params = [p for p in trainer.critic.parameters() if p.requires_grad]
        trainer.critic_optimizer = torch.optim.AdamW(trainer.critic_params, lr=cfg.critic_lr,
                                                     weight_decay=cfg.weight_decay)
    if trainer.baseline is not None:
        trainer.baseline = GlobalBaseline(trainer.baseline, dp)
    trainer.dist = dp
    return trainer


def split(kept: list[Trajectory], world_size: int, by_task: bool = False) -> list[list[Trajectory]]:
    """Contiguous, near-equal parts (rank order = batch order); by_task: whole task groups per part."""
    units: dict[str, list[Trajectory]] = {}
    for i, t in enumerate(kept):
        units.setdefault(t.task_id if by_task else str(i), []).append(t)
    groups, parts, done = list(units.values()), [], 0
    for r in range(world_size):
        part, goal = [], round(len(kept) * (r + 1) / world_size)
        while groups and (done < goal or r == world_size - 1):
            part += groups.pop(0)
            done = sum(map(len, parts)) + len(part)
        parts.append(part)
    return parts


def full_state_dict(module: nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    """The sharded module's full state dict on CPU, on rank 0 ({} elsewhere); every rank must call."""
    sd = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k.removeprefix(prefix): v for k, v in sd.items()}


def _full_optimizer_state(module: nn.Module, optimizer, prefix: str = "") -> dict:
    """The optimizer's gathered state in torch's own format (integer ids in parameter order), rank 0."""
    osd = get_optimizer_state_dict(module, optimizer, options=StateDictOptions(full_state_dict=True,
                                                                              cpu_offload=True))
    names = [n for n, p in module.named_parameters() if p.requires_grad]
    index = {n: i for i, n in enumerate(names)}
    state = {index[k]: v for k, v in osd.get("state", {}).items()}
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in osd.get("param_groups", [])]
    return {"state": state, "param_groups": groups} if dist.get_rank() == 0 else {}


def gathered(trainer: SAOTrainer) -> SimpleNamespace | None:
    """Unsharded CPU copies for checkpoint.save_checkpoint(policy=, critic=, trainer=) on rank 0 (None
    elsewhere); every rank must call. Costs one fp32 copy of both models on rank 0."""
    from transformers import AutoModel, AutoModelForCausalLM  # lazy: heavy

    policy_sd = full_state_dict(trainer.policy, "lm.")
    critic_sd = full_state_dict(trainer.critic) if trainer.critic is not None else None
    optim = _full_optimizer_state(trainer.policy, trainer.policy_optimizer)
    critic_optim = (_full_optimizer_state(trainer.critic, trainer.critic_optimizer)
                    if trainer.critic_optimizer is not None else None)
    if dist.get_rank() != 0:
        return None
    policy = AutoModelForCausalLM.from_config(trainer.policy.lm.config, dtype=torch.float32)
    policy.load_state_dict(policy_sd)
    critic = None
    if critic_sd is not None:
        critic = Critic(AutoModel.from_config(trainer.critic.backbone.config, dtype=torch.float32))
        critic.load_state_dict(critic_sd)
    baseline = trainer.baseline.baseline if isinstance(trainer.baseline, GlobalBaseline) else trainer.baseline
    view = SimpleNamespace(dtype=trainer.dtype, baseline=baseline,
                           policy_optimizer=SimpleNamespace(state_dict=lambda: optim),
                           critic_optimizer=None if critic_optim is None
                           else SimpleNamespace(state_dict=lambda: critic_optim))
    return SimpleNamespace(policy=policy, critic=critic, trainer=view)


# --- one rank, and how ranks start --------------------------------------------------------------

class RankTrainer:
    """One data-parallel rank: the process group and its sharded SAOTrainer. `build()` returns the
    (unsharded) SAOTrainer every rank starts from: the same weights on every rank."""

    def __init__(self, rank: int, world_size: int, address: tuple[str, int], build, device: str = "cpu",
                 ckpt=None):
        self.dp = DataParallel(rank, world_size, address, device)
        self.trainer = shard(build(), self.dp)
        if ckpt is not None:  # sharding rebuilt the optimizers: their states again, from the checkpoint
            load_optimizer_states(self, ckpt)

    def update(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """One update on the global batch (every rank gets all of it); the metrics of the whole
        batch (rank 0's view for the ones neither summed nor token-weighted)."""
        trainer, world = self.trainer, self.dp.world_size
        kept, unrewarded, stale, broken = trainer._select(trajectories)
        parts = split(kept, world, by_task=trainer.config.advantage == "grpo")
        mine = parts[self.dp.rank] if all(parts) else []  # too few to go round: skipped on every rank
        metrics = trainer.update(mine)
        n_in = len(trajectories)
        infra = sum(t.status == "infra_error" for t in trajectories)
        metrics.update({"rollout/trajectories_in": float(n_in), "rollout/excluded_unrewarded": float(unrewarded),
                        "rollout/dropped_stale": float(stale), "rollout/infra_failure_rate": infra / max(n_in, 1),
                        "rollout/break_frac": broken / max(n_in, 1)})
        if not mine:
            return metrics
        rewards = torch.tensor([float(t.reward) for t in kept])  # every rank has the whole batch
        metrics.update({"rollout/reward_mean": rewards.mean().item(),
                        "rollout/reward_std": rewards.std(unbiased=False).item(),
                        "rollout/turns_mean": sum(t.turns for t in kept) / len(kept),
                        "rollout/truncation_rate": sum(t.status.startswith("truncated") for t in kept) / len(kept)})

        def name(key: str) -> str:  # "loss/value_loss" and "value_loss" alike
            return key.rsplit("/", 1)[-1]

        weight = next((v for k, v in metrics.items() if name(k) == "action_tokens"), 0.0)
        keys = sorted(k for k in metrics if name(k) in SUMMED + TOKEN_MEANS)
        summed = [name(k) in SUMMED for k in keys]
        reduced = self.dp._reduce([metrics[k] if s else metrics[k] * weight for k, s in zip(keys, summed)] + [weight])
        for k, s, v in zip(keys, summed, reduced):
            metrics[k] = v if s else v / max(reduced[-1], 1.0)
        return metrics

    def policy_weights(self, dtype: torch.dtype | str | None = None) -> dict[str, torch.Tensor]:
        """The full policy state dict (rank 0; {} elsewhere), cast to `dtype` (the engine's) if given."""
        sd = full_state_dict(self.trainer.policy, "lm.")
        if dtype is None:
            return sd
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        return {k: v.to(dtype) if v.is_floating_point() else v for k, v in sd.items()}

    def save_checkpoint(self, run_dir, step: int, *, tokenizer=None, state: dict, keep: int):
        """checkpoint.save_checkpoint from the gathered models (rank 0 writes; the path, None elsewhere)."""
        from trainer.checkpoint import save_checkpoint  # lazy: only the checkpointing rank needs it

        full = gathered(self.trainer)
        if full is None:
            return None
        return save_checkpoint(run_dir, step, policy=full.policy, critic=full.critic, trainer=full.trainer,
                               tokenizer=tokenizer, state=state, keep=keep)

    def counters(self) -> dict[str, int]:
        t = self.trainer
        return {"policy_version": t.policy_version, "updates": t.updates,
                "critic_optimizer_steps": t.critic_optimizer_steps, "policy_optimizer_steps": t.policy_optimizer_steps}

    def close(self) -> None:
        self.dp.close()


def load_optimizer_states(rt: RankTrainer, ckpt) -> None:
    """Resume: a checkpoint's AdamW states (torch's format, integer ids in parameter order) into the
    sharded optimizers; every rank reads the file (on several nodes: a shared file system)."""
    saved = torch.load(f"{ckpt}/optimizers.pt", weights_only=False)
    t = rt.trainer
    for module, optimizer, key in ((t.policy, t.policy_optimizer, "policy"), (t.critic, t.critic_optimizer, "critic")):
        if optimizer is None or saved.get(key) is None:
            continue
        names = [n for n, p in module.named_parameters() if p.requires_grad]
        osd = {"state": {names[i]: v for i, v in saved[key]["state"].items()},
               "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in saved[key]["param_groups"]]}
        set_optimizer_state_dict(module, optimizer, osd, options=StateDictOptions(full_state_dict=True))


def build_from_config(cfg, ckpt=None) -> SAOTrainer:
    """The `build` of a `sao train` rank (functools.partial(build_from_config, cfg, ckpt)): the trainer
    loop.build_trainer builds, fresh or from `ckpt`."""
    from trainer.loop import build_trainer  # lazy: the loop imports Ray and the actors

    torch.manual_seed(cfg.run.seed)  # the loop's seed: a fresh critic head starts alike on every rank
    return build_trainer(cfg, cfg.model.path, ckpt)[2]


def start_ranks(world_size: int, build, device: str = "cpu", host: str = "127.0.0.1", num_gpus: float = 0,
                ckpt=None):
    """`world_size` RankTrainer Ray actors (one per rank, Ray places them over the cluster's nodes;
    `host` is this node's address the others reach: rank 0 runs here). Returns the actor handles, rank
    order. Every call on them (update, policy_weights, save_checkpoint) goes to all ranks; rank 0 answers."""
    import ray  # lazy: heavy
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # lazy: part of ray

    port = free_port(host)
    actor = ray.remote(num_gpus=num_gpus)(RankTrainer)
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return [(actor.options(scheduling_strategy=here) if r == 0 else actor).remote(r, world_size, (host, port), build,
                                                                                 device, ckpt)
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
