"""A tiny Qwen3-MoE policy, synthetic multi-turn trajectories and a trainer for the update-step tests."""
from __future__ import annotations

import random

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from sao_harness.harness.trace import Segment, Trajectory
from sao_harness.trainer.algo.sao import SAOTrainer
from sao_harness.trainer.config import TrainerConfig
from sao_harness.trainer.modeling.models import Critic

VOCAB = 512


def tiny_policy(seed=0):
    torch.manual_seed(seed)
    config = Qwen3MoeConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                            num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1,
                            max_position_embeddings=4096)
    return Qwen3MoeForCausalLM(config)


def synthetic_trajectories(n=8, seed=0, version=0):
    """Multi-turn trajectories; reward 1 iff the first action token is even (learnable by the critic)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        segments = []
        for _ in range(rng.randint(1, 3)):
            segments.append(Segment("observation", [rng.randrange(VOCAB) for _ in range(rng.randint(2, 9))]))
            k = rng.randint(1, 6)
            segments.append(Segment("action", [rng.randrange(VOCAB) for _ in range(k)],
                                    [-rng.uniform(5.5, 7.0) for _ in range(k)], [version] * k))
        first_action = next(s for s in segments if s.kind == "action").token_ids[0]
        out.append(Trajectory(task_id=f"task{i % 3}", segments=segments, reward=float(first_action % 2 == 0),
                              turns=len(segments) // 2))
    return out


def trajectory_with_break(traj_id="broken", reward=1.0, version=0) -> Trajectory:
    """Two turns, the second on a new token sequence (the client rewrote its history): a break at token 7."""
    return Trajectory(task_id="task0", traj_id=traj_id, reward=reward, turns=2, breaks=[7], segments=[
        Segment("observation", [11, 12, 13, 14]), Segment("action", [15, 16, 17], [-6.0] * 3, [version] * 3),
        Segment("observation", [11, 12, 13, 21, 22]), Segment("action", [23, 24], [-6.0] * 2, [version] * 2)])


def make_trainer(sampling=None, **overrides):
    """A SAOTrainer of the tiny policy: TrainerConfig `overrides`, logprobs under `sampling` (a SamplingConfig)."""
    policy = tiny_policy()
    config = TrainerConfig(**({"lr": 1e-3, "critic_lr": 1e-2, "critic_warmup_steps": 0, "max_tokens_per_microbatch": 96}
                              | overrides))
    critic = Critic.from_policy(policy) if config.advantage == "gae" else None
    return SAOTrainer(policy, critic, config, sampling=sampling)
