"""`sao train` with trainer.value_pretrain_checkpoint under bf16 mixed precision: the value-pretrained
fp32 critic reaches the trainer's fp32 masters unrounded (the compute dtype stays bf16)."""
from __future__ import annotations

import random

import torch

from sao_harness.harness.config import SamplingConfig
from sao_harness.harness.trace import Segment, Trajectory
from sao_harness.trainer.config import TrainerConfig, ValuePretrainConfig
from sao_harness.trainer.modeling.critic_init import freeze_critic, load_backbone_critic
from sao_harness.trainer.modeling.models import save_critic
from sao_harness.trainer.warm.value_pretrain import pretrain_critic

STEPS = 20  # value-pretraining steps: a short run


def returns_corpus(n: int, seed: int = 0) -> list[Trajectory]:
    """Trajectories whose reward is 1 iff the first action starts with token 77 (a learnable return)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        obs = [rng.randrange(100, 4000) for _ in range(6)]
        act = [77 if i % 2 == 0 else rng.randrange(100, 4000)] + [rng.randrange(100, 4000) for _ in range(5)]
        segments = [Segment("observation", obs), Segment("action", act, [-8.3] * 6, [0] * 6)]
        out.append(Trajectory(task_id=f"t{i % 4}", segments=segments, reward=float(i % 2 == 0), turns=1))
    return out


def pretrained_critic(model_path: str, tc: TrainerConfig, directory) -> tuple[dict, dict]:
    """(base, pretrained) state dicts of a short one-process `sao value-pretrain` with model.dtype=bfloat16
    (run_value_pretrain's steps: the bf16 backbone, frozen, pretrain_critic's fp32 masters and AdamW at
    the default lr), the critic saved as it saves it (save_critic of the fp32 masters)."""
    critic = load_backbone_critic(model_path, "bfloat16")
    freeze_critic(critic, tc)
    base = {n: t.float().clone() for n, t in critic.state_dict().items()}
    vp = ValuePretrainConfig(max_steps=STEPS, batch_size=4, eval_trajectories=0, patience=STEPS)
    pretrain_critic(critic, returns_corpus(16), vp, tc, verbose=False)
    save_critic(critic.cpu(), directory)
    return base, {n: t.clone() for n, t in critic.state_dict().items()}


def test_value_pretrained_critic_reaches_the_fp32_masters_unrounded(tiny_model_dir, tmp_path):
    from sao_harness.trainer.run.loop import build_trainer  # lazy: torch

    tc = TrainerConfig(advantage="gae")
    base, pretrained = pretrained_critic(str(tiny_model_dir), tc, tmp_path / "critic")
    tc = tc.model_copy(update={"value_pretrain_checkpoint": str(tmp_path / "critic")})
    _, critic, trainer, _ = build_trainer(tc, SamplingConfig(), "cpu", str(tiny_model_dir), "bfloat16", None)
    assert trainer.dtype == torch.bfloat16  # bf16 compute ...
    masters = critic.state_dict()
    experts = [n for n in pretrained if "experts" in n]
    assert experts and all(masters[n].dtype == torch.float32 for n in masters)  # ... over fp32 masters

    change = torch.cat([(pretrained[n] - base[n]).flatten() for n in experts])
    kept = torch.cat([(masters[n] - base[n]).flatten() for n in experts])
    fraction = float(kept @ change / (change @ change))  # the pretraining change kept, projected
    moved = change != 0
    returned = int((moved & (kept == 0)).sum())  # moved by pretraining, back at the old value
    assert moved.any()
    assert fraction > 0.999 and returned == 0, (
        f"kept {fraction:.4f} of the pretraining change; {returned} of {int(moved.sum())} moved entries "
        "returned to their old values")
    for name, tensor in pretrained.items():  # exactly the saved fp32 critic, value head included
        assert torch.equal(masters[name], tensor), name
