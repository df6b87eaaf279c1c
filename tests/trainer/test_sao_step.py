"""The SAO update step on the tiny Qwen3-MoE with synthetic trajectories."""
from __future__ import annotations

import copy
import math

import pytest
import torch

from sao_harness.harness.config import SamplingConfig
from sao_harness.harness.trace import Segment, Status, Trajectory
from sao_harness.trainer.algo.batch import build_batch, micro_batches
from sao_harness.trainer.algo.gae import gae_reference
from sao_harness.trainer.algo.objective import compute_advantages, policy_loss
from sao_harness.trainer.config import TrainerConfig
from sao_harness.trainer.modeling.models import policy_token_logprobs
from sao_harness.trainer.report.metrics import FAMILIES, family
from tests.support.trainer_data import make_trainer, synthetic_trajectories, trajectory_with_break  # noqa: E402


def test_build_batch_layout_and_rejections():
    trajs = synthetic_trajectories(3)
    batch = build_batch(trajs, pad_token_id=7)
    for row, t in enumerate(trajs):
        n = t.num_tokens
        assert batch.input_ids[row, :n].tolist() == t.token_ids and (batch.input_ids[row, n:] == 7).all()
        assert batch.action_mask[row, :n].tolist() == t.is_action
        last = max(i for i, a in enumerate(t.is_action) if a)
        assert batch.rewards[row, last] == t.reward and batch.rewards[row].abs().sum() == abs(t.reward)
        assert batch.logp_rollout[row][batch.action_mask[row]].tolist() == pytest.approx(
            [x for x in t.logp_rollout if x is not None])
    broken = synthetic_trajectories(1)[0]
    broken.breaks = [3]
    with pytest.raises(ValueError, match="breaks"):
        build_batch([broken])
    no_reward = synthetic_trajectories(1)[0]
    no_reward.status, no_reward.reward = Status.INFRA_ERROR, None
    with pytest.raises(ValueError, match="reward is None"):
        build_batch([no_reward])
    starts_with_action = Trajectory(task_id="t", reward=1.0,
                                    segments=[Segment("action", [1, 2], [-1.0, -1.0], [0, 0])])
    with pytest.raises(ValueError, match="starts with an action"):
        build_batch([starts_with_action])
    empty = Trajectory(task_id="t", reward=0.0, segments=[Segment("observation", [1, 2, 3])])
    assert build_batch([empty]).action_mask.sum() == 0


def test_decoupled_lambdas_returns_are_the_reward_and_advantages_use_lambda_p():
    """docs/algorithm.md section 3.3: critic targets with lambda_c = 1 (gamma = 1: G = R at every action token);
    advantages with lambda_p = 1 - 1/(1.5 l), checked against the plain-Python GAE of test_gae."""
    trajs = synthetic_trajectories(5)
    batch = build_batch(trajs)
    values = torch.rand(batch.input_ids.shape)
    config = TrainerConfig(whiten_advantages=False)
    advantages, returns = compute_advantages(batch, values, config)
    for row, t in enumerate(trajs):
        mask = batch.action_mask[row]
        torch.testing.assert_close(returns[row][mask], torch.full((int(mask.sum()),), t.reward))
        lam_p = 1 - 1 / (1.5 * t.num_action_tokens)
        ref, _ = gae_reference(values[row].tolist(), batch.rewards[row].tolist(), mask.tolist(), 1.0, lam_p)
        torch.testing.assert_close(advantages[row], torch.tensor(ref), atol=1e-5, rtol=1e-5)


def test_micro_batches_respect_the_token_budget():
    batch = build_batch(synthetic_trajectories(10))
    groups = micro_batches(batch, 60)
    assert sorted(r for g in groups for r in g) == list(range(10))
    lengths = batch.attention_mask.sum(1)
    for g in groups:
        assert len(g) == 1 or int(lengths[g].sum()) <= 60  # packed: real tokens, no padding


def test_smoke_value_loss_falls_and_k_critic_steps_per_policy_step():
    trainer = make_trainer(critic_steps=3, max_staleness=100)
    counts = {"critic": 0, "policy": 0}
    for name, opt in (("critic", trainer.critic_optimizer), ("policy", trainer.policy_optimizer)):
        real_step = opt.step

        def counted(*args, _name=name, _real=real_step, **kwargs):
            counts[_name] += 1
            return _real(*args, **kwargs)
        opt.step = counted
    trajs = synthetic_trajectories(8)
    policy_before = copy.deepcopy(trainer.policy.state_dict())
    history = [trainer.update(trajs) for _ in range(6)]
    assert counts == {"critic": 18, "policy": 6}
    assert history[-1]["loss/value_loss"] < 0.25 * history[0]["loss/value_loss"]
    assert history[-1]["critic/explained_variance"] > 0.5
    assert any(not torch.equal(policy_before[k], v) for k, v in trainer.policy.state_dict().items())
    assert trainer.policy_version == 6
    required = ["critic/explained_variance", "critic/grad_norm", "policy/grad_norm", "policy/dis_masked",
                "policy/dis_masked_low", "policy/dis_masked_high", "policy/ratio_mean", "policy/ratio_min",
                "policy/ratio_max", "policy/logp_abs_diff_mean", "policy/logp_abs_diff_max",
                "rollout/version_lag_mean", "rollout/version_lag_max", "loss/value_loss", "loss/policy_loss",
                "policy/adv_raw_mean", "policy/adv_raw_std", "policy/adv_mean", "policy/adv_std", "policy/entropy",
                "rollout/action_tokens", "rollout/turns_mean", "rollout/truncation_rate",
                "rollout/infra_failure_rate", "rollout/reward_mean", "perf/update_tokens_per_s", "time/policy_s"]
    for m in history:
        assert all(k in m for k in required) and all(isinstance(v, float) for v in m.values())
        assert m["policy/dis_masked"] == pytest.approx(m["policy/dis_masked_low"] + m["policy/dis_masked_high"])
    assert history[-1]["rollout/version_lag_max"] == 5.0  # tokens sampled by version 0, policy now at 5
    assert abs(history[-1]["policy/adv_mean"]) < 1e-5
    assert history[-1]["policy/adv_std"] == pytest.approx(1.0, abs=1e-4)


def test_policy_gradient_comes_only_from_action_positions():
    trainer = make_trainer()
    batch = build_batch(synthetic_trajectories(4))
    values = trainer.compute_values(batch, micro_batches(batch, 10_000))
    advantages, _ = compute_advantages(batch, values, trainer.config)
    obs = batch.attention_mask & ~batch.action_mask

    def loss_and_grads(logp_rollout, adv):
        trainer.policy.zero_grad(set_to_none=True)
        logp, _ = policy_token_logprobs(trainer.policy, batch.input_ids, batch.attention_mask, batch.action_mask)
        logp.retain_grad()
        loss, _ = policy_loss(logp, logp_rollout, adv, batch.action_mask, trainer.config)
        loss.backward()
        grads = [p.grad.clone() for p in trainer.policy.parameters() if p.grad is not None]
        return loss.item(), grads, logp.grad

    loss, grads, logp_grad = loss_and_grads(batch.logp_rollout, advantages)
    assert (logp_grad[~batch.action_mask] == 0).all() and (logp_grad[batch.action_mask] != 0).any()
    noisy_rollout = torch.where(obs, torch.randn_like(batch.logp_rollout) * 10, batch.logp_rollout)
    noisy_adv = torch.where(obs, torch.randn_like(advantages) * 10, advantages)
    loss2, grads2, _ = loss_and_grads(noisy_rollout, noisy_adv)
    assert loss2 == loss and all(torch.equal(a, b) for a, b in zip(grads, grads2))
    perturbed_action = advantages + batch.action_mask * 0.5  # a change at action tokens does matter
    loss3, _, _ = loss_and_grads(batch.logp_rollout, perturbed_action)
    assert loss3 != loss


def test_micro_batching_gives_the_same_step_as_one_batch():
    """Same gradients (compared at the optimizer step; Adam would amplify float noise in near-zero
    gradients), same losses."""
    trajs = synthetic_trajectories(6)
    grads = {}
    trainers = {"small": make_trainer(max_tokens_per_microbatch=40),
                "large": make_trainer(max_tokens_per_microbatch=100_000)}
    for key, trainer in trainers.items():
        for which, opt in (("policy", trainer.policy_optimizer), ("critic", trainer.critic_optimizer)):
            real_step = opt.step

            def recording(*args, _key=(key, which), _opt=opt, _real=real_step, **kwargs):
                grads.setdefault(_key, []).append([p.grad.clone() if p.grad is not None else None
                                                   for g in _opt.param_groups for p in g["params"]])
                return _real(*args, **kwargs)
            opt.step = recording
    m_small, m_large = trainers["small"].update(trajs), trainers["large"].update(trajs)
    assert m_small["perf/micro_batches"] > 1 and m_large["perf/micro_batches"] == 1
    for key in ("loss/value_loss", "loss/policy_loss", "policy/grad_norm", "critic/grad_norm"):
        assert m_small[key] == pytest.approx(m_large[key], rel=1e-4, abs=1e-6)
    for which in ("policy", "critic"):
        for step_small, step_large in zip(grads[("small", which)], grads[("large", which)], strict=True):
            for a, b in zip(step_small, step_large, strict=True):
                assert (a is None) == (b is None)
                if a is not None:
                    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_frozen_critic_parameters_do_not_change_in_an_update():
    trainer = make_trainer()
    before = {n: p.detach().clone() for n, p in trainer.critic.named_parameters()}
    trainer.update(synthetic_trajectories(4))
    frozen = set(trainer.frozen_critic_params)
    assert any(".self_attn." in n for n in frozen)
    for name, p in trainer.critic.named_parameters():
        assert torch.equal(p, before[name]) == (name in frozen), name


def test_excluded_and_stale_trajectories_are_counted():
    trainer = make_trainer(max_staleness=2)
    trainer.policy_version = 5
    fresh = synthetic_trajectories(3, version=4)
    stale = synthetic_trajectories(2, seed=1, version=2)
    failed = synthetic_trajectories(1, seed=2, version=5)[0]
    failed.status, failed.reward = Status.INFRA_ERROR, None
    m = trainer.update(fresh + stale + [failed])
    assert (m["rollout/trajectories"], m["rollout/dropped_stale"], m["rollout/excluded_unrewarded"]) == (3.0, 2.0, 1.0)
    assert m["rollout/infra_failure_rate"] == pytest.approx(1 / 6)
    only_failed = trainer.update([failed])
    assert only_failed["policy/skipped_update"] == 1.0 and trainer.policy_version == 6


def test_empty_and_observation_only_trajectories_train_nothing_and_break_nothing():
    trainer = make_trainer()
    empty = Trajectory(task_id="e", reward=0.0, segments=[])
    observation_only = Trajectory(task_id="o", reward=1.0, segments=[Segment("observation", [1, 2, 3])])
    m = trainer.update(synthetic_trajectories(3) + [empty, observation_only])
    assert m["rollout/trajectories"] == 5.0 and all(math.isfinite(v) for v in m.values())
    assert m["rollout/action_tokens"] == float(sum(t.num_action_tokens for t in synthetic_trajectories(3)))


def test_a_trajectory_with_breaks_is_skipped_and_counted_never_one_row():
    """Breaks never crash an update (before: build_batch raised and `sao train` died): the trajectory
    is left out, counted in rollout/break_frac, and the rest trains as without it."""
    good = synthetic_trajectories(3)
    reference = make_trainer().update(copy.deepcopy(good))
    trainer = make_trainer()
    m = trainer.update(good + [trajectory_with_break()])
    assert (m["rollout/trajectories_in"], m["rollout/trajectories"], m["rollout/break_frac"]) == (4.0, 3.0, 0.25)
    assert m["rollout/action_tokens"] == float(sum(t.num_action_tokens for t in good))
    assert m["loss/policy_loss"] == pytest.approx(reference["loss/policy_loss"])
    assert reference["rollout/break_frac"] == 0.0 and m["policy/trained"] == 1.0
    only = trainer.update([trajectory_with_break(version=1)])
    assert (only["policy/skipped_update"], only["rollout/break_frac"], trainer.policy_version) == (1.0, 1.0, 1)


SWITCHES = [
    {"advantage": "grpo", "policy_loss": "ppo", "importance": "tis"},
    {"advantage": "grpo", "policy_loss": "dis"},
    {"advantage": "running_mean", "policy_loss": "ppo", "importance": "mis", "running_mean_scope": "global"},
    {"skip_observations": False, "policy_lambda": 0.95, "policy_loss": "ppo"},
    {"dis_grad": "literal", "dis_denominator": "kept", "whiten_advantages": False, "critic_freeze": "none"},
    {"sampling": SamplingConfig(temperature=0.7, top_k=50, top_p=0.9), "value_clip": 0.2, "critic_only_steps": 1},
]


@pytest.mark.parametrize("overrides", SWITCHES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_every_switch_runs(overrides):
    trainer = make_trainer(**overrides)
    m = trainer.update(synthetic_trajectories(6))
    assert all(math.isfinite(v) for k, v in m.items() if k != "critic/explained_variance")
    assert m["policy/trained"] == (0.0 if overrides.get("critic_only_steps") else 1.0)
    assert ("loss/value_loss" in m) == (trainer.config.advantage == "gae")
    assert ("policy/clip_frac" in m) == (trainer.config.policy_loss == "ppo")
    assert ("policy/dis_masked" in m) == (trainer.config.policy_loss == "dis" and "critic_only_steps" not in overrides)


def test_every_metric_of_an_update_belongs_to_a_family():
    """Every key an update returns (and so every key logged) is `<family>/<name>`, one of the six families."""
    metrics = {}
    for overrides in ({}, {"policy_loss": "ppo", "importance": "tis", "ppo_epochs": 2}, {"critic_only_steps": 1}):
        trainer = make_trainer(**overrides)
        metrics |= trainer.update(synthetic_trajectories(6))
    failed = synthetic_trajectories(1)[0]
    failed.status, failed.reward = Status.INFRA_ERROR, None
    metrics |= make_trainer().update([failed])  # a skipped update
    assert set(FAMILIES) == {"loss", "critic", "policy", "rollout", "perf", "time"}
    assert not [k for k in metrics if family(k) is None], "metrics outside the six families"
    assert {family(k) for k in metrics} == set(FAMILIES)


def test_config_rejects_dis_with_importance_correction():
    with pytest.raises(ValueError, match="importance must be 'none'"):
        TrainerConfig(policy_loss="dis", importance="tis")
    with pytest.raises(ValueError, match="critic_only_steps needs advantage='gae'"):
        TrainerConfig(advantage="grpo", critic_only_steps=3)
    with pytest.raises(ValueError, match="extra"):
        TrainerConfig(not_a_field=1)
    assert TrainerConfig().window == 8 and TrainerConfig(running_mean_scope="global").window == 128
