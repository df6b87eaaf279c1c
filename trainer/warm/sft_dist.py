"""`sao sft` with runtime.world_size > 1: TRL's SFT step on FSDP2 data-parallel ranks, the path `sao train`'s
ranks run (trainer.dist.distributed), so that a warm start of a model no GPU holds whole needs no other tool.

    ranks      world_size local processes (distributed.spawn: gloo on CPU; sft.device=cuda: NCCL, rank r on
               cuda:r), each building the policy sharded from the start (build_sharded_policy: the meta
               build, fully_shard per decoder layer + root, its own shards read from model.path)
    step t     sft.batch_size x sft.grad_accum examples (an epoch's last step: the ones left), the same on
               every rank (a seeded shuffle per epoch), split over the ranks by tokens
               (distributed.token_parts); each rank packs its part into micro-batches of at most
               trainer.max_tokens_per_microbatch tokens (trainer.algo.batch.pack_groups), logprobs in chunks
               of trainer.logprob_chunk positions (trainer.modeling.models.policy_token_logprobs)
    loss       L = sum over every rank's action tokens of -log pi(token) / N,  N = the action tokens of
               the whole step on all ranks (TRL's num_items_in_batch; an example's first token has no
               predictor and does not count); FSDP sums the gradients over the ranks, so grad L is the
               gradient of the whole step in one process
    update     clip to the global gradient norm MAX_GRAD_NORM (TRL's default), AdamW on the fp32 master
               shards (weight decay 0, TRL's), lr_t = sft.lr (T - t + 1) / T (sft.lr_schedule=linear,
               TRL's: decay to 0 over the T steps) or sft.lr (constant)
    steps      T = sft.max_steps, or ceil(sft.epochs x ceil(examples / (batch_size x grad_accum)))
    precision  fp32; sft.device=cuda: parameters all-gathered and forwards in bf16 where supported (as
               TRL's bf16=True), fp32 gradient reduction and masters
    output     the model directory, whole or not at all: model.safetensors streamed from the shards in the
               input's dtype (trainer.dist.sharded.write_hf_policy: one gathered tensor at a time, no full fp32
               copy anywhere), config.json and generation_config.json copied from the input, its tokenizer

Not as TRL's one process: the example order (not TRL's sampler), micro-batches packed by tokens instead of
sft.batch_size padded rows, no MoE load-balancing loss (sft.router_aux_loss_coef > 0 is refused, by
trainer.warm.sft) and no token-accuracy metric.
"""
from __future__ import annotations

import math
import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch

from sao_harness.core.files import atomic_dir
from sao_harness.trainer.algo.batch import pack_groups
from sao_harness.trainer.config import SFTConfig, TrainerConfig
from sao_harness.trainer.dist import distributed, sharded
from sao_harness.trainer.modeling.models import policy_token_logprobs, use_packed_attention
from sao_harness.trainer.modeling.precision import autocast, train_mode

MAX_GRAD_NORM = 1.0  # transformers' TrainingArguments.max_grad_norm, which TRL keeps and `sao sft` never sets


# --- the schedule (every rank computes the same) ------------------------------------------------

def steps_per_epoch(num_examples: int, sft: SFTConfig) -> int:
    return math.ceil(num_examples / (sft.batch_size * sft.grad_accum))


def total_steps(num_examples: int, sft: SFTConfig) -> int:
    """T: sft.max_steps, or as many as sft.epochs passes take (TRL's count)."""
    return sft.max_steps or math.ceil(sft.epochs * steps_per_epoch(num_examples, sft))


def step_batches(num_examples: int, per_step: int, seed: int) -> Iterator[tuple[int, list[int]]]:
    """Endless (epoch, example indices) of one step each: a fresh permutation per epoch, cut into
    `per_step` chunks, the last chunk of an epoch what is left."""
    rng, epoch = random.Random(seed), 0
    while True:
        order = list(range(num_examples))
        rng.shuffle(order)
        for start in range(0, num_examples, per_step):
            yield epoch, order[start:start + per_step]
        epoch += 1


def learning_rate(step: int, total: int, sft: SFTConfig) -> float:
    """lr at step `step` of 1..total: linear = sft.lr (total - step + 1) / total (TRL's linear decay with
    no warm-up), constant = sft.lr."""
    return sft.lr * (total - step + 1) / total if sft.lr_schedule == "linear" else sft.lr


# --- one rank -------------------------------------------------------------------------------------

def _packed(examples: list[dict], device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The examples end to end as one row [1, L]: (input_ids, position_ids restarting at 0 per example,
    action mask: assistant_masks but at each example's first token, which nothing predicts)."""
    ids = [torch.tensor(e["input_ids"], dtype=torch.long) for e in examples]
    masks = [torch.tensor(e["assistant_masks"], dtype=torch.bool) for e in examples]
    for m in masks:
        m[0] = False
    positions = [torch.arange(len(x)) for x in ids]
    return tuple(torch.cat(x)[None].to(device) for x in (ids, positions, masks))


def action_tokens(example: dict) -> int:
    """The tokens of an example the loss counts: its action tokens after the first token."""
    return sum(example["assistant_masks"][1:])


def build(model_path: str, dp: distributed.DataParallel, dtype: str, sft: SFTConfig, trainer: TrainerConfig,
          offload: bool = False) -> distributed.LogprobView:
    """This rank's shard of the policy, activation checkpointing as sft.gradient_checkpointing (always) or
    trainer.checkpoint_above_tokens say."""
    return distributed.build_sharded_policy(model_path, dtype, dp, always_checkpoint=sft.gradient_checkpointing,
                                            checkpoint_above=trainer.checkpoint_above_tokens, offload=offload)


def train(policy: distributed.LogprobView, dp: distributed.DataParallel, examples: list[dict], sft: SFTConfig,
          trainer: TrainerConfig, dtype: str, seed: int = 0, report=None) -> list[dict]:
    """The T steps of the module doc on this rank's shard (every rank calls, with the same arguments).
    Returns the records {step, loss, grad_norm, learning_rate, entropy, num_tokens, epoch} (TRL's log
    names; the whole step's, the same on every rank); `report(step, T, numbers)` gets each one."""
    device, compute = dp.device, getattr(torch, dtype)
    use_packed_attention(policy.lm, trainer.attn_impl)
    train_mode(policy)
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=sft.lr, weight_decay=0.0)
    pad = getattr(policy.config, "pad_token_id", None) or 0
    total, per_epoch = total_steps(len(examples), sft), steps_per_epoch(len(examples), sft)
    batches = step_batches(len(examples), sft.batch_size * sft.grad_accum, seed)
    history, seen_tokens = [], 0.0
    if report is not None:
        report.begin()
    for step in range(1, total + 1):
        _, rows = next(batches)
        lengths = [len(examples[i]["input_ids"]) for i in rows]
        mine = [rows[j] for j in distributed.token_parts(lengths, dp.world_size)[dp.rank]]
        n = max(dp.sum(sum(action_tokens(examples[i]) for i in mine)), 1.0)
        groups = pack_groups([len(examples[i]["input_ids"]) for i in mine], trainer.max_tokens_per_microbatch)
        most = dp.max(len(groups))  # asked before the passes: FSDP's collectives pair up only pass for pass
        optimizer.zero_grad(set_to_none=True)
        loss, entropy = 0.0, 0.0
        for group in groups:
            ids, positions, mask = _packed([examples[mine[j]] for j in group], device)
            with autocast(device, compute):
                logp, ent = policy_token_logprobs(policy, ids, None, mask, chunk_size=trainer.logprob_chunk,
                                                  position_ids=positions)
            nll = -logp.sum() / n  # logp is 0 off the action tokens
            nll.backward()
            loss, entropy = loss + nll.item(), entropy + ent.sum().item()
        dp.zero_passes(policy, most - len(groups), pad, device, compute, backward=True)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM))
        lr = learning_rate(step, total, sft)
        for g in optimizer.param_groups:
            g["lr"] = lr
        optimizer.step()
        seen_tokens += dp.sum(sum(len(examples[i]["input_ids"]) for i in mine))
        numbers = {"loss": dp.sum(loss), "grad_norm": grad_norm, "learning_rate": lr,
                   "entropy": dp.sum(entropy) / n, "num_tokens": seen_tokens, "epoch": step / per_epoch}
        history.append({"step": step, **numbers})
        if report is not None:
            report(step, total, numbers)
    return history


def write_model(out: Path, policy: distributed.LogprobView, model_path: str, rank: int) -> None:
    """The model directory `out` (module doc) from the shards: every rank calls (the gathers), rank 0
    writes it, whole or not at all."""
    from transformers import AutoConfig, AutoTokenizer  # lazy: heavy

    dtype = getattr(AutoConfig.from_pretrained(model_path), "dtype", None) or torch.float32  # saved as the input
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype

    def write(tmp: Path) -> None:
        sharded.write_hf_policy(tmp, policy.lm, dtype)
        for name in ("config.json", "generation_config.json"):  # the input's, not the in-memory config's
            if (Path(model_path) / name).is_file():
                shutil.copyfile(Path(model_path) / name, tmp / name)
        AutoTokenizer.from_pretrained(model_path).save_pretrained(tmp)

    if rank == 0:
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_dir(out, write)
    else:
        sharded.write_hf_policy(out, policy.lm, dtype)  # the collective gathers; only rank 0 writes


def _rank(rank: int, world_size: int, address, model_path: str, examples: list[dict], sft: SFTConfig,
          trainer: TrainerConfig, devices: list[str], dtype: str, offload: bool, out: Path, seed: int,
          report) -> list[dict] | None:
    """One rank of `run`: build, train, write; rank 0 reports and returns the records."""
    dp = distributed.DataParallel(rank, world_size, address, devices[rank])
    report = report if rank == 0 else None
    try:
        policy = build(model_path, dp, dtype, sft, trainer, offload)
        history = train(policy, dp, examples, sft, trainer, dtype, seed, report)
        write_model(out, policy, model_path, rank)
    finally:
        if report is not None:
            report.close()
        dp.close()
    return history if rank == 0 else None


def run(model_path: str, examples: list[dict], max_length: int, sft: SFTConfig, trainer: TrainerConfig,
        devices: list[str], out: Path, seed: int = 0, offload: bool = False, report=None) -> list[dict]:
    """SFT on len(devices) ranks (rank r on devices[r]) on `examples` (trainer.warm.sft.to_examples), each cut
    to `max_length` tokens; writes the model directory `out`; rank 0's records (`train`)."""
    examples = [{"input_ids": e["input_ids"][:max_length], "assistant_masks": e["assistant_masks"][:max_length]}
                for e in examples]
    cuda = devices[0].startswith("cuda")
    dtype = "bfloat16" if cuda and torch.cuda.is_bf16_supported() else "float32"
    return distributed.spawn(len(devices), _rank, model_path, examples, sft, trainer, devices, dtype, offload, out,
                             seed, report)[0]
