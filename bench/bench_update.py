"""Update throughput of `SAOTrainer.update`, in action tokens per second: fp32 vs bf16 autocast
(fp32 master weights), with vs without activation checkpointing. One run, ratios printed; no timed
assertions (the machine is shared).

    .venv/bin/python bench/bench_update.py [--steps 3] [--tokens 1024] [--device cpu]
"""
from __future__ import annotations

import argparse
import random
import time

import _common  # noqa: F401  (puts the checkout on sys.path)
import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from sao_harness.harness.trace import Segment, Trajectory
from sao_harness.trainer.algo.sao import SAOTrainer
from sao_harness.trainer.config import TrainerConfig
from sao_harness.trainer.modeling.models import Critic

VOCAB = 4096


def tiny_policy() -> Qwen3MoeForCausalLM:
    torch.manual_seed(0)
    return Qwen3MoeForCausalLM(Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
        max_position_embeddings=32_768))


def trajectories(n: int, tokens: int, seed: int = 0) -> list[Trajectory]:
    """n episodes of about `tokens` tokens, a tenth of them actions, in 4 turns."""
    rng = random.Random(seed)
    turn = tokens // 4
    out = []
    for i in range(n):
        segments = []
        for _ in range(4):
            k = max(1, turn // 10)
            segments.append(Segment("observation", [rng.randrange(VOCAB) for _ in range(turn - k)]))
            segments.append(Segment("action", [rng.randrange(VOCAB) for _ in range(k)], [-8.0] * k, [0] * k))
        out.append(Trajectory(task_id=f"t{i % 4}", segments=segments, reward=float(i % 2), turns=4))
    return out


def throughput(dtype: torch.dtype, checkpointing: bool, args) -> float:
    policy = tiny_policy().to(dtype)
    config = TrainerConfig(gradient_checkpointing=checkpointing, max_staleness=10**6, critic_warmup_steps=0)
    trainer = SAOTrainer(policy, Critic.from_policy(policy), config, device=args.device)
    batch = trajectories(args.batch, args.tokens)
    trainer.update(batch)  # warm-up
    t0 = time.perf_counter()
    action_tokens = 0.0
    for _ in range(args.steps):
        action_tokens += trainer.update(batch)["rollout/action_tokens"]
    return action_tokens / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=1024, help="tokens per episode")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    runs = {}
    for dtype in (torch.float32, torch.bfloat16):
        for ckpt in (False, True):
            runs[dtype, ckpt] = throughput(dtype, ckpt, args)
            print(f"{str(dtype).removeprefix('torch.'):>8}  checkpointing={'on ' if ckpt else 'off'}  "
                  f"{runs[dtype, ckpt]:8.0f} action tokens/s", flush=True)
    print(f"bf16 autocast / fp32 (checkpointing off): {runs[torch.bfloat16, False] / runs[torch.float32, False]:.2f}x")
    print(f"bf16 autocast / fp32 (checkpointing on):  {runs[torch.bfloat16, True] / runs[torch.float32, True]:.2f}x")
    print(f"checkpointing on / off (fp32):            {runs[torch.float32, True] / runs[torch.float32, False]:.2f}x")
    print(f"checkpointing on / off (bf16):            {runs[torch.bfloat16, True] / runs[torch.bfloat16, False]:.2f}x")


if __name__ == "__main__":
    main()
