"""The GPU check: one SAO update (a critic step and a policy step) of real model shapes on one GPU,
through the trainer's own code, at 8k, 32k, 64k and 128k tokens.

    models     random weights, built on the device, full width and vocabulary (151,936), 4 layers:
               a Qwen3-8B slice and a Qwen3-30B-A3B slice (128 experts, 8 routed)
    the path   SAOTrainer (fp32 masters, bf16 compute, activation checkpointing per layer), sharded by
               trainer.dist.distributed.shard (FSDP2, world 1 over NCCL, MixedPrecisionPolicy), the update's
               packed micro-batches (trainer.algo.batch.pack) and chunked logprobs (trainer.modeling.models)
    per size   tokens/s of the update, MFU (model FLOPs: 7 F for the value pass + critic step + policy
               step, F = 2 active params per token + causal attention, against the GPU's dense bf16 peak),
               peak GPU memory and the plan's estimate of it (trainer.gpu_plan), and the plan's memory per
               GPU of the full depth on 8 ranks (without / with runtime.offload_optimizer); for the MoE slice,
               the routed experts' overhead: their bytes per token in the trace (this slice, the full depth)
               and the update with routing replay on against the same update without routes (trainer.router_replay)

    python bench/gpu_update.py                  the GPU run (skips, exit 0, without CUDA)
    python bench/gpu_update.py --dry-run        the same code path on CPU (gloo), tiny shapes, seconds

Trainer calls it depends on: TrainerConfig, SAOTrainer(policy, critic, config) and .update(trajectories),
Critic.from_policy, trainer.dist.distributed.DataParallel / free_port / shard, trainer.gpu_plan.
"""
from __future__ import annotations

import argparse
import gc
import math
import resource
import sys
import time

import _common  # noqa: F401  (puts the checkout on sys.path: this runs from a bare checkout, no install)
import torch

GiB = 2 ** 30
QWEN3_8B = dict(model_type="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                tie_word_embeddings=False)
QWEN3_30B_A3B = dict(model_type="qwen3_moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                     num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                     num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, decoder_sparse_step=1,
                     tie_word_embeddings=False)
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16)
TINY_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
BF16_PEAK = {"H200": 989e12, "H100": 989e12, "H800": 989e12, "H20": 148e12, "A100": 312e12, "A800": 312e12,
             "B200": 2250e12, "GH200": 989e12, "L40S": 362e12}  # dense TFLOP/s, by name in the device name


def families(dry_run: bool) -> list[tuple[str, dict, int]]:
    """(name, config.json fields of the slice, the full model's depth)."""
    if dry_run:
        return [("qwen3 tiny x2", {**QWEN3_8B, **TINY}, QWEN3_8B["num_hidden_layers"]),
                ("qwen3_moe tiny x2", {**QWEN3_30B_A3B, **TINY, **TINY_MOE}, QWEN3_30B_A3B["num_hidden_layers"])]
    return [("Qwen3-8B x4", {**QWEN3_8B, "num_hidden_layers": 4}, QWEN3_8B["num_hidden_layers"]),
            ("Qwen3-30B-A3B x4", {**QWEN3_30B_A3B, "num_hidden_layers": 4}, QWEN3_30B_A3B["num_hidden_layers"])]


def trajectories(n: int, tokens: int, vocab: int, turns: int = 4, seed: int = 0, routes: tuple | None = None):
    """n episodes of `tokens` tokens each, `turns` turns, a tenth of each turn actions; the rollout
    logprob is the uniform one, log(1 / vocab), about a random model's (DIS ratios near 1). `routes`
    (MoE layers, top_k, experts): with random routed experts, distinct per token and layer."""
    from sao_harness.harness.trace import Segment, Trajectory  # lazy: after the CUDA check

    g = torch.Generator().manual_seed(seed)
    ids = lambda k: torch.randint(0, vocab, (k,), generator=g).tolist()
    out = []
    for i in range(n):
        segments, left = [], tokens
        for t in range(turns):
            size = left if t == turns - 1 else tokens // turns
            act = max(1, size // 10)
            segments += [Segment("observation", ids(size - act)),
                         Segment("action", ids(act), [-math.log(vocab)] * act, [0] * act)]
            left -= size
        routed = None
        if routes is not None:
            layers, top_k, experts = routes
            draw = torch.rand(tokens, layers, experts, generator=g)
            routed = draw.argsort(-1)[..., :top_k].to(torch.int16).numpy()
        out.append(Trajectory(task_id=f"t{i}", segments=segments, reward=float(i % 2), turns=turns,
                              routed_experts=routed))
    return out


def model_flops(shapes, lengths: list[int], action_tokens: int) -> float:
    """Model FLOPs of one update: 7 F (value pass 1 + critic step 3 + policy step 3, each step forward +
    backward) + 3 x 2 V H per action token (the LM head, only where logprobs are read); F = 2 x active
    parameters per token + 2 n^2 n_h d L per sequence of n tokens (causal attention); recomputation
    under checkpointing is not counted."""
    from sao_harness.trainer.gpu_plan import param_counts  # lazy: after the CUDA check

    c, s = param_counts(shapes), shapes
    mlp = (s.experts_per_token * 3 * s.hidden * s.expert_intermediate + s.experts * s.hidden if s.sparse_layers
           else 3 * s.hidden * s.intermediate)
    active = c["self_attn"] + s.layers * mlp
    forward = sum(2 * active * n + 2 * n * n * s.heads * s.head_dim * s.layers for n in lengths)
    return 7 * forward + 3 * 2 * s.vocab * s.hidden * action_tokens


def peak(device: torch.device) -> str:
    """The peak GPU memory allocated (CPU: the process's peak RSS, libraries included)."""
    if device.type == "cuda":
        return f"peak {human(torch.cuda.max_memory_allocated(device))}"
    return f"peak RSS {human(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)}"  # Linux: KiB


def human(n: float) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB / 10 else f"{n / 2 ** 20:.1f} MiB"


def run_family(name: str, fields: dict, full_layers: int, args, dp) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM  # lazy: after the CUDA check (the skip is quick)

    from sao_harness.trainer.algo.sao import SAOTrainer  # lazy: after the CUDA check
    from sao_harness.trainer.config import TrainerConfig  # lazy: after the CUDA check
    from sao_harness.trainer.dist.distributed import shard  # lazy: after the CUDA check
    from sao_harness.trainer.gpu_plan import (  # lazy: after the CUDA check
        Shapes,
        critic_params,
        param_counts,
        trainer_memory,
    )
    from sao_harness.trainer.modeling.models import Critic  # lazy: after the CUDA check

    device, dtype = dp.device, torch.bfloat16
    config = AutoConfig.for_model(**fields, max_position_embeddings=max(262144, max(args.sizes)),
                                  attn_implementation=args.attn)
    torch.manual_seed(0)
    with device:
        policy = AutoModelForCausalLM.from_config(config, dtype=dtype)
        critic = Critic.from_policy(policy)
    shapes = Shapes.from_config(config)
    tcfg = TrainerConfig(gradient_checkpointing=True, max_tokens_per_microbatch=max(args.sizes),
                         critic_steps=1, critic_warmup_steps=0, max_staleness=10 ** 9, logprob_chunk=args.chunk,
                         critic_freeze_router=shapes.sparse_layers > 0)  # a dense model has no router
    trainer = shard(SAOTrainer(policy, critic, tcfg, device=device), dp)
    full = Shapes.from_config(AutoConfig.for_model(**{**fields, "num_hidden_layers": full_layers}))
    crit = lambda s: critic_params(param_counts(s), s, tcfg.critic_freeze, tcfg.critic_freeze_norms,
                                   tcfg.critic_freeze_router, tcfg.critic_freeze_embeddings)
    peak_flops = next((v for k, v in BF16_PEAK.items() if k in torch.cuda.get_device_name(device)), None) \
        if device.type == "cuda" else None
    if device.type == "cuda":  # warm-up: AdamW's states, NCCL's buffers, the kernels' first launches
        trainer.update(trajectories(args.trajectories, min(args.sizes) // args.trajectories, config.vocab_size))
    failed = None
    for size in args.sizes:
        head = f"{name:<18} {size:>7,} tokens"
        if failed:
            print(f"{head}: skipped ({failed} at a smaller size)", flush=True)
            continue
        batch = trajectories(args.trajectories, size // args.trajectories, config.vocab_size, seed=size)
        tokens = sum(t.num_tokens for t in batch)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        try:
            t0 = time.perf_counter()
            m = trainer.update(batch)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds = time.perf_counter() - t0
        except torch.OutOfMemoryError:
            failed = "out of memory"
            print(f"{head}: out of memory ({peak(device)})", flush=True)
            trainer.policy_optimizer.zero_grad(set_to_none=True)
            trainer.critic_optimizer.zero_grad(set_to_none=True)
            gc.collect()
            torch.cuda.empty_cache()
            continue
        assert m.get("policy/skipped_update", 0.0) == 0.0 and m["rollout/tokens"] == tokens, m
        flops = model_flops(shapes, [t.num_tokens for t in batch], int(m["rollout/action_tokens"]))
        mfu = f"MFU {flops / seconds / peak_flops:5.1%}" if peak_flops else "MFU n/a"
        plan = lambda s, w, off, n=tokens: human(trainer_memory(s, w, n, 2, True, args.chunk, off, crit(s)).total)
        print(f"{head}: {tokens / seconds:9,.0f} tokens/s (update {seconds:6.2f} s: critic {m['time/critic_s']:.2f} s, "
              f"policy {m['time/policy_s']:.2f} s), {mfu}, {peak(device)} (plan {plan(shapes, 1, False)}); "
              f"full {full_layers} layers on 8 GPUs: {plan(full, 8, False)} per GPU, {plan(full, 8, True)} with "
              "offload_optimizer", flush=True)
        if shapes.sparse_layers:
            replay_update(trainer, args, size, config, shapes, full, seconds, head)
    del trainer, policy, critic
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def replay_update(trainer, args, size: int, config, shapes, full, seconds: float, head: str) -> None:
    """The routed experts' overhead at this size: bytes per token (int16 [MoE layers, top_k]) and the same
    update with the trace's routes replayed, against `seconds` (the update without routes)."""
    device = trainer.device
    batch = trajectories(args.trajectories, size // args.trajectories, config.vocab_size, seed=size,
                         routes=(shapes.sparse_layers, shapes.experts_per_token, shapes.experts))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    m = trainer.update(batch)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    replayed = time.perf_counter() - t0
    per_token = 2 * shapes.sparse_layers * shapes.experts_per_token
    print(f"{head}: routed experts {per_token} B/token ({2 * full.sparse_layers * full.experts_per_token} B/token "
          f"at the full depth: {human(2 * full.sparse_layers * full.experts_per_token * size)} per {size:,}-token "
          f"trace); update with replay {replayed:6.2f} s = {replayed / seconds:.2f}x the unreplayed one, route "
          f"agreement {m.get('rollout/route_agreement', float('nan')):.1%} (random routes)", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, gloo, tiny shapes, short lengths")
    parser.add_argument("--sizes", type=int, nargs="+", default=None,
                        help="tokens per update (default 8k 32k 64k 128k; dry run 256 512)")
    parser.add_argument("--trajectories", type=int, default=None,
                        help="trajectories per update, packed into one micro-batch (default 1 on GPU: one "
                        "long episode, SDPA's causal kernel; 2 in the dry run). With SDPA, more than one "
                        "materialises a [tokens, tokens] mask: use --attn flex_attention or flash_attention_2")
    parser.add_argument("--attn", default="sdpa", help="transformers attn_implementation (sdpa, flex_attention, "
                        "flash_attention_2)")
    parser.add_argument("--chunk", type=int, default=None, help="trainer.logprob_chunk (default 4096; dry run 64)")
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("bench/gpu_update.py: skipped: no CUDA device (torch.cuda.is_available() is False); "
              "--dry-run runs the same code path on CPU with tiny shapes")
        return 0
    args.sizes = args.sizes or ([128, 256] if args.dry_run else [8192, 32768, 65536, 131072])
    args.trajectories = args.trajectories or (2 if args.dry_run else 1)
    args.chunk = args.chunk or (64 if args.dry_run else 4096)
    from sao_harness.trainer.dist.distributed import DataParallel, free_port  # lazy: after the CUDA check

    device = "cpu" if args.dry_run else "cuda:0"
    if args.dry_run:
        torch.set_num_threads(1)  # tiny shapes: threads only contend
    dp = DataParallel(0, 1, ("127.0.0.1", free_port()), device)
    where = "CPU (dry run)" if args.dry_run else torch.cuda.get_device_name(0)
    print(f"gpu_update: {where}, torch {torch.__version__}, FSDP2 world 1 ({'gloo' if args.dry_run else 'nccl'}), "
          f"bf16 compute / fp32 masters, checkpointing on, attn {args.attn}, {args.trajectories} trajectory(ies) "
          f"per update packed, logprob chunk {args.chunk}", flush=True)
    try:
        for name, fields, full_layers in families(args.dry_run):
            run_family(name, fields, full_layers, args, dp)
    finally:
        dp.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
