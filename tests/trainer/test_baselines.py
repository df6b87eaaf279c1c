"""The baselines do what their names say: GRPO's advantages as normalised per group, PPO against a
real pi_old, the PPO ablation trains every value it uses. Checked against hand-computed numbers."""
from __future__ import annotations

import copy

import pytest
import torch

from sao_harness.harness.trace import Segment, Trajectory
from sao_harness.trainer.algo import objective
from sao_harness.trainer.algo.batch import build_batch
from sao_harness.trainer.config import TrainerConfig
from sao_harness.trainer.modeling.models import policy_token_logprobs
from tests.support.trainer_data import make_trainer, synthetic_trajectories


def traj(task, reward, lengths):
    """Alternating observation / action segments of the given lengths (token ids 1, 2, ...)."""
    segments = [Segment("observation" if i % 2 == 0 else "action", list(range(1, n + 1)),
                        *(([-1.0] * n, [0] * n) if i % 2 else ())) for i, n in enumerate(lengths)]
    return Trajectory(task_id=task, segments=segments, reward=reward, turns=len(lengths) // 2)


def test_grpo_uses_its_group_advantages_without_a_second_whitening():
    # group a: R = 1, 0, 0, 0: mean 1/4, sample std sqrt((9/16 + 3/16) / 3) = 1/2 -> A = 3/2, -1/2
    # group b: R = 0, 0, 0, 0: A = 0 (batch whitening would give it a nonzero advantage)
    trajs = [traj("a", r, [2, 3]) for r in (1.0, 0.0, 0.0, 0.0)] + [traj("b", 0.0, [2, 3]) for _ in range(4)]
    batch = build_batch(trajs)
    config = TrainerConfig(advantage="grpo", whiten_advantages=True)
    _, advantages, _ = objective.training_advantages(batch, None, config)
    expected = [1.5, -0.5, -0.5, -0.5, 0.0, 0.0, 0.0, 0.0]
    for row, a in enumerate(expected):
        torch.testing.assert_close(advantages[row][batch.action_mask[row]], torch.full((3,), a), atol=1e-5, rtol=0)
    assert (advantages[~batch.action_mask] == 0).all()


def _capture_pi_old(monkeypatch):
    seen = []
    real = objective.ppo_policy_loss

    def spy(logp, logp_old, *args, **kwargs):
        seen.append((logp.detach().clone(), logp_old.clone()))
        return real(logp, logp_old, *args, **kwargs)
    monkeypatch.setattr(objective, "ppo_policy_loss", spy)
    return seen


def test_ppo_pi_old_is_the_policy_before_the_update_and_the_clip_binds(monkeypatch):
    trajs = synthetic_trajectories(8)
    trainer = make_trainer(advantage="grpo", policy_loss="ppo", lr=3e-2, ppo_epochs=2, minibatches=4,
                           max_tokens_per_microbatch=100_000)
    before = copy.deepcopy(trainer.policy)
    batch = build_batch(trajs)
    with torch.no_grad():  # pi_old by hand: the untouched copy's logprobs
        ref, _ = policy_token_logprobs(before, batch.input_ids, batch.attention_mask, batch.action_mask)
    seen = _capture_pi_old(monkeypatch)
    steps = trainer.policy_optimizer_steps
    m = trainer.update(trajs)
    assert trainer.policy_optimizer_steps - steps == 8 and trainer.policy_version == 1  # 2 epochs x 4
    training = seen[:-1]  # the last call is the metrics pass
    assert len(training) == 8
    assert sum(old.numel() for _, old in training) == 2 * int(batch.attention_mask.sum())  # every token once per epoch
    ref_actions = ref[batch.action_mask]
    for _, logp_old in training:  # packed micro-batches: pi_old at each action token is the copy's
        for x in logp_old[logp_old != 0]:
            assert (ref_actions - x).abs().min() < 1e-5, "pi_old must be the pre-update policy"
    assert m["policy/clip_frac"] > 0


def test_ppo_one_minibatch_one_epoch_never_clips():
    trainer = make_trainer(advantage="grpo", policy_loss="ppo", lr=3e-2)
    assert trainer.update(synthetic_trajectories(8))["policy/clip_frac"] == 0.0


def test_config_rejects_minibatches_without_ppo():
    with pytest.raises(ValueError, match="need policy_loss='ppo'"):
        TrainerConfig(policy_loss="dis", minibatches=2)


@pytest.mark.parametrize("skip, expected", [
    # GAE through observations: value tokens = every real token but position 0.
    # row 0 (obs 3, act 2, obs 2, act 2, obs 2; R = 1): G = 1 at positions 1..8, G = 0 at 9, 10
    # row 1 (obs 4, act 3; R = 0.5): G = 0.5 at positions 1..6.   V = 0 (zero value head):
    # loss = 0.5 * (8 * 1 + 2 * 0 + 6 * 0.25) / 16
    (False, 0.5 * (8 + 6 * 0.25) / 16),
    # observation-skipping GAE: the 4 + 3 action tokens only
    (True, 0.5 * (4 + 3 * 0.25) / 7),
])
def test_the_critic_trains_every_value_the_advantages_use(skip, expected):
    trajs = [traj("a", 1.0, [3, 2, 2, 2, 2]), traj("b", 0.5, [4, 3])]
    trainer = make_trainer(skip_observations=skip, critic_steps=1, policy_lambda=0.9)
    assert trainer.update(trajs)["loss/value_loss"] == pytest.approx(expected, rel=1e-6)
