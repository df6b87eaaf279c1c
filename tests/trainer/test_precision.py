"""Mixed precision, exact resume and activation checkpointing of the SAO update (trainer.modeling.precision).

Hand references: AdamW's first step moves every weight with a gradient |g| >> eps by lr * g / |g|
(bias-corrected m / sqrt(v) = g / |g|), so at lr 1e-6 a trainer that updates fp32 masters moves
~all of them by 1e-6, while a bf16 weight (spacing 2^-8 relative) cannot take such a step.
"""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from sao_harness.harness.trace import Segment, Trajectory
from sao_harness.trainer.algo import sao
from sao_harness.trainer.algo.sao import SAOTrainer
from sao_harness.trainer.config import TrainerConfig
from sao_harness.trainer.dist import checkpoint
from sao_harness.trainer.modeling.models import Critic, load_critic
from sao_harness.trainer.modeling.precision import engine_weights
from tests.support.trainer_data import synthetic_trajectories, tiny_policy

LR = 1e-6


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    tiny_policy().save_pretrained(path)
    return path


def bf16_trainer(model_dir, **overrides) -> SAOTrainer:
    """As the loop builds it: the policy loaded in model.dtype, the critic a copy of its base model
    (with a nonzero value head, so the backbone gets a gradient in the first step too)."""
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    config = TrainerConfig(**({"lr": LR, "critic_lr": LR, "critic_warmup_steps": 0, "max_staleness": 100,
                               "max_tokens_per_microbatch": 96} | overrides))
    critic = Critic.from_policy(policy)
    torch.nn.init.normal_(critic.value_head.weight, std=0.1, generator=torch.Generator().manual_seed(0))
    return SAOTrainer(policy, critic, config)


def moved_fraction(trainer: SAOTrainer) -> dict[str, tuple[float, torch.Tensor]]:
    """One update; per model, the fraction of trainable elements with a nonzero gradient that moved,
    and their steps |delta w|."""
    models = {"policy": trainer.policy, "critic": trainer.critic}
    before = {k: [p.detach().float().clone() for p in m.parameters() if p.requires_grad] for k, m in models.items()}
    trainer.update(synthetic_trajectories(8))
    out = {}
    for key, model in models.items():
        params = [p for p in model.parameters() if p.requires_grad]
        has_grad = torch.cat([(p.grad != 0).flatten() for p in params])
        delta = torch.cat([(p.detach().float() - b).abs().flatten() for p, b in zip(params, before[key])])
        out[key] = ((delta[has_grad] > 0).float().mean().item(), delta[has_grad])
    return out


def test_bf16_update_at_lr_1e6_moves_the_fp32_master_weights(model_dir):
    trainer = bf16_trainer(model_dir, critic_steps=1)  # one AdamW step per model: the hand reference applies
    assert trainer.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in trainer.policy.parameters())
    for key, (fraction, delta) in moved_fraction(trainer).items():
        assert fraction >= 0.9, key
        # AdamW's first step: |delta w| = lr for |g| >> eps (hand reference in the module doc)
        assert abs(delta.median().item() - LR) < 0.02 * LR, key


def test_the_same_update_without_master_weights_does_not_move_bf16_weights(model_dir, monkeypatch):
    """Power: the trainer before master weights (bf16 modules under plain AdamW) fails the test above."""
    monkeypatch.setattr(sao, "to_master_weights", lambda module: module)
    trainer = bf16_trainer(model_dir, critic_steps=1)
    assert all(p.dtype == torch.bfloat16 for p in trainer.policy.parameters())
    for key, (fraction, _) in moved_fraction(trainer).items():
        assert fraction < 0.9, key


def test_engine_weights_are_the_masters_in_the_engine_dtype(model_dir):
    trainer = bf16_trainer(model_dir)
    weights = engine_weights(trainer.policy, "bfloat16")
    master = trainer.policy.state_dict()
    assert weights.keys() == master.keys()
    for name, t in weights.items():
        assert t.dtype == torch.bfloat16 and torch.equal(t, master[name].to(torch.bfloat16)), name


def _resume(ckpt, config) -> SAOTrainer:
    """What the loop's resume does: models from the checkpoint in the model dtype, then the state."""
    policy = AutoModelForCausalLM.from_pretrained(ckpt / "policy", dtype=torch.bfloat16)
    trainer = SAOTrainer(policy, load_critic(ckpt / "critic"), config)
    checkpoint.restore_optimizers(ckpt, trainer)
    state = checkpoint.read_state(ckpt)
    trainer.policy_version, trainer.updates = state["policy_version"], state["updates"]
    trainer.critic_optimizer_steps = state["critic_optimizer_steps"]
    trainer.policy_optimizer_steps = state["policy_optimizer_steps"]
    return trainer


def _resume_matches(model_dir, tmp_path) -> bool:
    first, second = synthetic_trajectories(8, seed=1), synthetic_trajectories(8, seed=2)
    straight = bf16_trainer(model_dir, lr=1e-4, critic_lr=1e-4)
    straight.update(first)
    ckpt = checkpoint.save_checkpoint(tmp_path, 1, policy=straight.policy, critic=straight.critic, trainer=straight,
                                      tokenizer=None, keep=3, state={
                                          "policy_version": straight.policy_version, "updates": straight.updates,
                                          "critic_optimizer_steps": straight.critic_optimizer_steps,
                                          "policy_optimizer_steps": straight.policy_optimizer_steps})
    straight.update(second)
    resumed = _resume(ckpt, straight.config)
    resumed.update(second)
    same = True
    for a, b in ((straight.policy, resumed.policy), (straight.critic, resumed.critic)):
        sa, sb = a.state_dict(), b.state_dict()
        same &= sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    return same


def test_resume_after_step_n_gives_the_uninterrupted_step_n_plus_1(model_dir, tmp_path):
    assert _resume_matches(model_dir, tmp_path)
    policy_dir = checkpoint.latest_checkpoint(tmp_path) / "policy"  # servable, in the model dtype
    served = AutoModelForCausalLM.from_pretrained(policy_dir)
    assert {p.dtype for p in served.parameters()} == {torch.bfloat16}


def test_resume_from_the_bf16_policy_alone_is_not_exact(model_dir, tmp_path, monkeypatch):
    """Power: without the fp32 masters (policy/ only, rounded to bf16) the resumed step differs."""
    monkeypatch.setattr(checkpoint, "load_model", lambda *args, **kwargs: None)
    assert not _resume_matches(model_dir, tmp_path)


# --- activation checkpointing --------------------------------------------------------------------

def long_trajectories(n=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        segments = []
        for _ in range(2):
            segments.append(Segment("observation", torch.randint(512, (200,), generator=g).tolist()))
            segments.append(Segment("action", torch.randint(512, (60,), generator=g).tolist(), [-6.0] * 60, [0] * 60))
        out.append(Trajectory(task_id=f"t{i}", segments=segments, reward=float(i % 2), turns=2))
    return out


def saved_activation_bytes(checkpointing: bool) -> int:
    trainer = SAOTrainer(tiny_policy(), None,
                         TrainerConfig(advantage="running_mean", gradient_checkpointing=checkpointing))
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        trainer.update(long_trajectories())
    return total


def test_activation_checkpointing_saves_at_least_4x_fewer_bytes():
    assert saved_activation_bytes(False) >= 4 * saved_activation_bytes(True)


def test_activation_checkpointing_in_eval_mode_saves_nothing(monkeypatch):
    """Power: the trainer before this fix ran its passes in eval mode, where transformers does not
    checkpoint; the measurement above then fails."""
    monkeypatch.setattr(sao, "train_mode", lambda module: module.train(False))
    assert saved_activation_bytes(False) < 4 * saved_activation_bytes(True)
