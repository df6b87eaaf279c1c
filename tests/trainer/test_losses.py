"""Losses, baselines and importance weights against their formulas (docs/algorithm.md sections 1, 4, 6)."""
from __future__ import annotations

import math
import statistics

import pytest
import torch

from sao_harness.trainer.algo.losses import (
    RunningMeanBaseline,
    dis_policy_loss,
    explained_variance,
    grpo_advantages,
    mis_weights,
    ppo_policy_loss,
    tis_weights,
    value_loss,
    whiten_advantages,
)

EPS_LOW, EPS_HIGH = 0.8, 3.0  # ratio window (0.2, 4.0)


def dis_case():
    """Six action tokens + one observation (last position). Ratios and advantages:
        ratio  0.1   0.1   0.5   2.0   5.0   5.0  | obs
        A      +1    -1    -1    +2    +1    -1   | 7 (ignored)
        kept   no    no    yes   yes   no    no       (both sides masked whatever the sign)
    logp = log(ratio) + logp_rollout with logp_rollout = -1 everywhere.
    """
    ratio = torch.tensor([[0.1, 0.1, 0.5, 2.0, 5.0, 5.0, 1.0]])
    logp_rollout = torch.full((1, 7), -1.0)
    logp = (ratio.log() + logp_rollout).requires_grad_()
    adv = torch.tensor([[1.0, -1.0, -1.0, 2.0, 1.0, -1.0, 7.0]])
    mask = torch.tensor([[True] * 6 + [False]])
    return logp, logp_rollout, adv, mask


def test_dis_hand_worked_loss_and_gradient():
    logp, logp_rollout, adv, mask = dis_case()
    loss, metrics = dis_policy_loss(logp, logp_rollout, adv, mask, EPS_LOW, EPS_HIGH)
    # kept tokens 2 and 3: loss = -(1/6) * (0.5 * -1 * logp_2 + 2.0 * 2 * logp_3)
    #   logp_2 = log 0.5 - 1 = -1.693147, logp_3 = log 2 - 1 = -0.306853
    #   loss = -(1/6) * (0.846574 - 1.227411) = 0.063473
    assert loss.item() == pytest.approx(-(1 / 6) * (0.5 * -1 * (math.log(0.5) - 1) + 4.0 * (math.log(2) - 1)), rel=1e-6)
    assert loss.item() == pytest.approx(0.063473, abs=1e-6)
    loss.backward()
    # gradient = -(1/N) m r A, i.e. m*r*A*grad(logp) for the ascent direction
    expected = torch.tensor([[0, 0, -(1 / 6) * 0.5 * -1, -(1 / 6) * 2.0 * 2, 0, 0, 0]])
    torch.testing.assert_close(logp.grad, expected)
    assert metrics["dis_masked_low_frac"] == pytest.approx(2 / 6)
    assert metrics["dis_masked_high_frac"] == pytest.approx(2 / 6)
    assert metrics["ratio_min"] == pytest.approx(0.1, rel=1e-5)
    assert metrics["ratio_max"] == pytest.approx(5.0, rel=1e-5)
    assert metrics["ratio_mean"] == pytest.approx((0.1 + 0.1 + 0.5 + 2 + 5 + 5) / 6, rel=1e-5)


def test_dis_masks_both_sides_regardless_of_advantage_sign():
    for sign in (1.0, -1.0):
        logp_rollout = torch.zeros(1, 2)
        logp = torch.tensor([[math.log(0.1), math.log(5.0)]], requires_grad=True)
        loss, _ = dis_policy_loss(logp, logp_rollout, torch.full((1, 2), sign), torch.ones(1, 2, dtype=torch.bool),
                                  EPS_LOW, EPS_HIGH)
        loss.backward()
        assert loss.item() == 0.0 and (logp.grad == 0).all()


def test_dis_open_interval_edges_are_out():
    low, high = math.log1p(-EPS_LOW), math.log1p(EPS_HIGH)  # log 0.2, log 4.0
    logp_rollout = torch.zeros(1, 4)
    logp = torch.tensor([[low, high, low + 1e-4, high - 1e-4]])
    _, metrics = dis_policy_loss(logp, logp_rollout, torch.ones(1, 4), torch.ones(1, 4, dtype=torch.bool),
                                 EPS_LOW, EPS_HIGH)
    assert metrics["num_kept_tokens"] == 2  # only the two just inside
    assert metrics["dis_masked_low_frac"] == 0.25 and metrics["dis_masked_high_frac"] == 0.25


def test_dis_gradient_equals_m_r_a_grad_logp_through_a_model():
    """Check grad(loss) = -(1/N) sum m r A grad(logp) for logp produced by a small network."""
    torch.manual_seed(0)
    net = torch.nn.Linear(5, 8)
    x, targets = torch.randn(1, 6, 5), torch.randint(0, 8, (1, 6))
    logp = torch.log_softmax(net(x), -1).gather(-1, targets[..., None]).squeeze(-1)
    logp_rollout = logp.detach() + torch.tensor([[0.0, 0.5, -0.5, 2.0, -3.0, 0.1]])  # r = exp(-offset)
    adv = torch.tensor([[1.0, -2.0, 0.5, 1.0, -1.0, 3.0]])
    mask = torch.tensor([[True, True, True, True, True, False]])
    loss, _ = dis_policy_loss(logp, logp_rollout, adv, mask, EPS_LOW, EPS_HIGH)
    grads = torch.autograd.grad(loss, list(net.parameters()), retain_graph=True)
    r = torch.exp(logp.detach() - logp_rollout)
    m = ((r > 0.2) & (r < 4.0) & mask).float()  # offsets 2.0 (r=.135) and -3.0 (r=20) are out
    assert m.tolist() == [[1, 1, 1, 0, 0, 0]]
    surrogate = -(m * r * adv * logp).sum() / 5
    expected = torch.autograd.grad(surrogate, list(net.parameters()))
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e)


def test_dis_literal_and_kept_denominator():
    logp, logp_rollout, adv, mask = dis_case()
    loss, _ = dis_policy_loss(logp, logp_rollout, adv, mask, EPS_LOW, EPS_HIGH, grad="literal")
    loss.backward()
    # d/dlogp of -(1/N) r A logp with r = exp(logp - logp_rollout): -(1/N) A r (1 + logp)
    r = torch.tensor([0.5, 2.0])
    lp = torch.tensor([math.log(0.5) - 1, math.log(2) - 1])
    a = torch.tensor([-1.0, 2.0])
    torch.testing.assert_close(logp.grad[0, 2:4], -(1 / 6) * a * r * (1 + lp))
    assert (logp.grad[0, [0, 1, 4, 5, 6]] == 0).all()
    logp2 = logp.detach().clone().requires_grad_()
    loss_kept, _ = dis_policy_loss(logp2, logp_rollout, adv, mask, EPS_LOW, EPS_HIGH, denominator="kept")
    loss_all, _ = dis_policy_loss(logp2, logp_rollout, adv, mask, EPS_LOW, EPS_HIGH, denominator="all")
    assert loss_kept.item() == pytest.approx(loss_all.item() * 6 / 2)


def test_dis_ignores_everything_at_observation_positions():
    logp, logp_rollout, adv, mask = dis_case()
    loss, _ = dis_policy_loss(logp, logp_rollout, adv, mask, EPS_LOW, EPS_HIGH)
    (grad,) = torch.autograd.grad(loss, logp)
    logp_b = logp.detach().clone()
    logp_b[0, 6] = -50.0
    logp_b.requires_grad_()
    rollout_b, adv_b = logp_rollout.clone(), adv.clone()
    rollout_b[0, 6], adv_b[0, 6] = float("nan"), -1e6
    loss_b, _ = dis_policy_loss(logp_b, rollout_b, adv_b, mask, EPS_LOW, EPS_HIGH)
    (grad_b,) = torch.autograd.grad(loss_b, logp_b)
    assert loss_b.item() == loss.item() and torch.equal(grad, grad_b)
    assert grad_b[0, 6] == 0


def test_dis_token_the_policy_cannot_sample_is_masked_without_nan():
    logp = torch.tensor([[-1.0, -math.inf]], requires_grad=True)
    loss, metrics = dis_policy_loss(logp, torch.tensor([[-1.0, -1.0]]), torch.ones(1, 2),
                                    torch.ones(1, 2, dtype=torch.bool), EPS_LOW, EPS_HIGH, grad="literal")
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert metrics["dis_masked_low_frac"] == 0.5 and metrics["ratio_min"] == 0.0


def reference_ppo(logp, logp_old, adv, clip_low, clip_high, weights=None):
    total = 0.0
    for i, (lp, lo, a) in enumerate(zip(logp, logp_old, adv)):
        r = math.exp(lp - lo)
        clipped = min(max(r, 1 - clip_low), 1 + clip_high)
        w = 1.0 if weights is None else weights[i]
        total += -w * min(r * a, clipped * a)
    return total / len(logp)


def test_ppo_clip_higher_matches_formula():
    logp_old = [-1.0, -1.0, -1.0, -1.0, -1.0, -1.0]
    ratios = [0.5, 0.5, 1.1, 1.5, 1.5, 1.2]
    adv = [1.0, -1.0, 2.0, 1.0, -1.0, 1.0]
    logp = torch.tensor([[math.log(r) - 1 for r in ratios] + [0.0]], requires_grad=True)
    mask = torch.tensor([[True] * 6 + [False]])
    adv_t = torch.tensor([adv + [100.0]])
    old_t = torch.tensor([logp_old + [5.0]])
    loss, metrics = ppo_policy_loss(logp, old_t, adv_t, mask, 0.2, 0.28)
    assert loss.item() == pytest.approx(reference_ppo(logp[0, :6].tolist(), logp_old, adv, 0.2, 0.28), rel=1e-6)
    loss.backward()
    # gradient only where the unclipped branch is active: -(1/6) r A
    #   0.5,A>0: r*A=.5 < .8*A -> active; 0.5,A<0: clip(.5)=.8 -> -.8 < -.5 -> clipped, no grad
    #   1.5,A>0: clipped at 1.28; 1.5,A<0: -1.5 < -1.28 -> active
    expected = [-(1 / 6) * 0.5 * 1, 0.0, -(1 / 6) * 1.1 * 2, 0.0, -(1 / 6) * 1.5 * -1, -(1 / 6) * 1.2, 0.0]
    torch.testing.assert_close(logp.grad[0], torch.tensor(expected))
    assert metrics["ppo_clip_frac"] == pytest.approx(2 / 6)
    weights = torch.tensor([[0.5, 1.0, 2.0, 0.0, 1.0, 1.5, 9.0]])
    loss_w, _ = ppo_policy_loss(logp, old_t, adv_t, mask, 0.2, 0.28, weights=weights)
    assert loss_w.item() == pytest.approx(
        reference_ppo(logp[0, :6].tolist(), logp_old, adv, 0.2, 0.28, weights[0, :6].tolist()), rel=1e-6)


def test_tis_and_mis_weights():
    logp_rollout = torch.tensor([-1.0, -1.0, -1.0, -1.0])
    logp_old = logp_rollout + torch.tensor([math.log(0.3), 0.0, math.log(1.9), math.log(3.0)])
    torch.testing.assert_close(tis_weights(logp_old, logp_rollout, cap=2.0), torch.tensor([0.3, 1.0, 1.9, 2.0]))
    torch.testing.assert_close(mis_weights(logp_old, logp_rollout, 0.5, 2.0), torch.tensor([0.0, 1.0, 1.9, 0.0]))
    assert not tis_weights(logp_old.requires_grad_(), logp_rollout).requires_grad


def test_grpo_group_advantages():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0])
    groups = ["a", "a", "b", "b", "c", "c", "c"]
    adv = grpo_advantages(rewards, groups)
    # group a: mean .5, sample std .7071 -> +-.7071; group b: std 0 -> 0;
    # group c: mean 1/3, sample std .57735 -> [-.57735, -.57735, 1.1547]
    expected = []
    for r, g in zip(rewards.tolist(), groups):
        members = [x for x, h in zip(rewards.tolist(), groups) if h == g]
        expected.append((r - statistics.mean(members)) / (statistics.stdev(members) + 1e-6))
    torch.testing.assert_close(adv, torch.tensor(expected))
    torch.testing.assert_close(adv[:2], torch.tensor([0.7071058, -0.7071058]), atol=1e-5, rtol=0)
    assert adv[2:4].tolist() == [0.0, 0.0]
    assert grpo_advantages(torch.tensor([3.0]), ["solo"]).tolist() == [0.0]


def test_running_mean_baseline_per_task_and_global():
    b = RunningMeanBaseline(window=2, scope="task")
    # batch 1: no history -> baseline 0
    assert b.advantages(["x", "x", "y"], [1.0, 0.0, 1.0]).tolist() == [1.0, 0.0, 1.0]
    # x history [1, 0] -> mean .5; y history [1] -> mean 1
    assert b.advantages(["x", "y"], [1.0, 0.0]).tolist() == [0.5, -1.0]
    # window 2: x history now [0, 1] -> .5; y [1, 0] -> .5
    assert b.advantages(["x", "y"], [0.0, 0.0]).tolist() == [-0.5, -0.5]
    g = RunningMeanBaseline(window=3, scope="global")
    g.advantages(["x", "y", "z", "w"], [1.0, 1.0, 0.0, 0.0])  # global window keeps [1, 0, 0]
    adv = g.advantages(["q"], [1.0])
    assert adv.tolist() == pytest.approx([1 - 1 / 3])
    restored = RunningMeanBaseline()
    restored.load_state_dict(g.state_dict())
    assert restored.baseline("anything") == pytest.approx(g.baseline("anything"))


def test_value_loss_plain_and_clipped():
    values = torch.tensor([[0.5, 2.0, 9.0, -1.0]], requires_grad=True)
    returns = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, False, True]])
    # 0.5 * ((.5-1)^2 + (2-1)^2 + (-1-0)^2) / 3 = 0.5 * 2.25 / 3 = 0.375
    loss = value_loss(values, returns, mask)
    assert loss.item() == pytest.approx(0.375)
    loss.backward()
    torch.testing.assert_close(values.grad, torch.tensor([[-0.5 / 3, 1.0 / 3, 0.0, -1.0 / 3]]))
    # clipped with V_old = [0, 0, 0, 0], clip .2: V_clip = [.2, .2, -, -.2]
    #   max((.5-1)^2, (.2-1)^2) = .64; max(1, .64) = 1; max(1, .04) = 1 -> 0.5 * 2.64 / 3 = .44
    clipped = value_loss(values, returns, mask, values_old=torch.zeros(1, 4), clip=0.2)
    assert clipped.item() == pytest.approx(0.44)
    with pytest.raises(ValueError, match="values_old"):
        value_loss(values, returns, mask, clip=0.2)


def test_whitening_and_explained_variance():
    adv = torch.tensor([[1.0, 2.0, 100.0, 3.0], [5.0, -7.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, False, True], [True, False, False, False]])
    w = whiten_advantages(adv, mask)
    vals = [1.0, 2.0, 3.0, 5.0]
    mean, std = statistics.mean(vals), statistics.pstdev(vals)
    torch.testing.assert_close(w[mask], torch.tensor([(v - mean) / (std + 1e-8) for v in vals]))
    assert (w[~mask] == 0).all()
    returns = torch.tensor([[1.0, 2.0, 50.0, 4.0]])
    values = torch.tensor([[1.5, 2.0, -9.0, 3.0]])
    m = torch.tensor([[True, True, False, True]])
    g, v = [1.0, 2.0, 4.0], [1.5, 2.0, 3.0]
    expected = 1 - statistics.pvariance([a - b for a, b in zip(g, v)]) / statistics.pvariance(g)
    assert explained_variance(values, returns, m) == pytest.approx(expected)
    assert math.isnan(explained_variance(values, torch.ones(1, 4), m))
    # every reward 0: returns equal up to float32 rounding (G = A + V); no -1e13 from noise over noise
    noisy_zero = torch.tensor([[1e-9, -2e-9, 0.0, 3e-9]])
    assert math.isnan(explained_variance(values, noisy_zero, m))
