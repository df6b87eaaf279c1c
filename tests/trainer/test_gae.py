"""GAE: the plain-Python reference against hand-worked cases, the fast scan against the reference
(docs/algorithm.md section 3)."""
from __future__ import annotations

import random

import pytest
import torch

from sao_harness.trainer.algo.gae import (
    discounted_reverse_cumsum,
    gae_reference,
    length_adaptive_lambda,
    skip_observation_gae,
    token_gae,
)


def random_trajectory_row(rng, length):
    """A row: obs, act, obs, act, ... of random segment lengths, then padding up to `length`."""
    mask = []
    while True:
        obs, act = rng.randint(1, 7), rng.randint(1, 5)
        if len(mask) + obs + act > length:
            break
        mask += [False] * obs + [True] * act
    real = len(mask)
    mask += [False] * (length - real)
    return mask


def make_batch(rng, rows, length):
    masks = [random_trajectory_row(rng, length) for _ in range(rows)]
    values = [[rng.uniform(-1, 1) for _ in range(length)] for _ in range(rows)]
    rewards = [[0.0] * length for _ in range(rows)]
    for r, m in enumerate(masks):
        if any(m):
            last = max(i for i, a in enumerate(m) if a)
            rewards[r][last] = rng.choice([0.0, 1.0, -0.5])
    return values, rewards, masks


def test_hand_worked_case():
    # positions: 0 obs, 1 obs, 2 act V=.2, 3 act V=.4, 4 obs V=9 (skipped), 5 act V=.5 R=1, 6 pad
    # compacted action sequence: V = [.2, .4, .5], r = [0, 0, 1]; gamma = 1, lambda = 0.5
    #   k=3: delta = 1 + 0 - .5 = .5                  A = .5                  G = 1.0
    #   k=2: delta = 0 + .5 - .4 = .1 (bridges obs)  A = .1 + .5 * .5 = .35   G = .75
    #   k=1: delta = 0 + .4 - .2 = .2                A = .2 + .5 * .35 = .375 G = .575
    # with lambda = 1: A = G - V = [.8, .6, .5], G = [1, 1, 1]
    values = torch.tensor([[7.0, 8.0, 0.2, 0.4, 9.0, 0.5, 3.0]])
    rewards = torch.tensor([[0, 0, 0, 0, 0, 1.0, 0]])
    mask = torch.tensor([[False, False, True, True, False, True, False]])
    adv, ret = skip_observation_gae(values, rewards, mask, gamma=1.0, lam=0.5)
    torch.testing.assert_close(adv, torch.tensor([[0, 0, 0.375, 0.35, 0, 0.5, 0]]))
    torch.testing.assert_close(ret, torch.tensor([[0, 0, 0.575, 0.75, 0, 1.0, 0]]))
    adv, ret = skip_observation_gae(values, rewards, mask, gamma=1.0, lam=1.0)
    torch.testing.assert_close(adv, torch.tensor([[0, 0, 0.8, 0.6, 0, 0.5, 0]]))
    torch.testing.assert_close(ret, torch.tensor([[0, 0, 1.0, 1.0, 0, 1.0, 0]]))


def test_reference_on_hand_worked_cases():
    """gae_reference is the definition the scan is checked against: check it by hand first."""
    values = [7.0, 8.0, 0.2, 0.4, 9.0, 0.5, 3.0]
    rewards = [0, 0, 0, 0, 0, 1.0, 0]
    skip = [False, False, True, True, False, True, False]
    # the case of test_hand_worked_case: gamma = 1, lambda = 0.5, then lambda = 1
    adv, ret = gae_reference(values, rewards, skip, 1.0, 0.5)
    assert adv == pytest.approx([0, 0, 0.375, 0.35, 0, 0.5, 0])
    assert ret == pytest.approx([0, 0, 0.575, 0.75, 0, 1.0, 0])
    adv, ret = gae_reference(values, rewards, skip, 1.0, 1.0)
    assert adv == pytest.approx([0, 0, 0.8, 0.6, 0, 0.5, 0])
    assert ret == pytest.approx([0, 0, 1.0, 1.0, 0, 1.0, 0])
    # gamma = 0.5, lambda = 1 on V = [.2, .4, .5], r = [0, 0, 1]:
    #   k=3: delta = 1 - .5 = .5              A = .5                 G = 1
    #   k=2: delta = .5 * .5 - .4 = -.15      A = -.15 + .5 * .5 = .1   G = .5
    #   k=1: delta = .5 * .4 - .2 = 0         A = 0 + .5 * .1 = .05     G = .25 (= gamma^(K-k) R)
    adv, ret = gae_reference(values, rewards, skip, 0.5, 1.0)
    assert adv == pytest.approx([0, 0, 0.05, 0.1, 0, 0.5, 0])
    assert ret == pytest.approx([0, 0, 0.25, 0.5, 0, 1.0, 0])
    # token GAE (mask = every real token, observations included), gamma = lambda = 1: G = R = 1 at
    # every position and A = 1 - V, the observation values 7, 8, 9 included; padding stays 0
    valid = [True] * 6 + [False]
    adv, ret = gae_reference(values, rewards, valid, 1.0, 1.0)
    assert adv == pytest.approx([-6.0, -7.0, 0.8, 0.6, -8.0, 0.5, 0])
    assert ret == pytest.approx([1.0] * 6 + [0])
    # lambda = 0: one-step TD, A_k = r_k + gamma V_{k+1} - V_k, bridging the observation at 4
    adv, _ = gae_reference(values, rewards, skip, 1.0, 0.0)
    assert adv == pytest.approx([0, 0, 0.2, 0.1, 0, 0.5, 0])


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (1.0, 0.9), (0.97, 0.95), (0.5, 0.0)])
def test_matches_python_reference(gamma, lam):
    rng = random.Random(0)
    values, rewards, masks = make_batch(rng, rows=6, length=300)
    adv, ret = skip_observation_gae(torch.tensor(values), torch.tensor(rewards), torch.tensor(masks), gamma, lam)
    for r in range(6):
        ref_adv, ref_ret = gae_reference(values[r], rewards[r], masks[r], gamma, lam)
        torch.testing.assert_close(adv[r], torch.tensor(ref_adv), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ret[r], torch.tensor(ref_ret), atol=1e-5, rtol=1e-5)


def test_equals_gae_on_compacted_action_sequence():
    """Observation segments of different lengths in between change nothing: the result equals GAE
    on the action tokens alone, laid out contiguously."""
    rng = random.Random(1)
    values, rewards, masks = make_batch(rng, rows=5, length=200)
    v, r, m = torch.tensor(values), torch.tensor(rewards), torch.tensor(masks)
    lam = torch.tensor([0.0, 0.5, 0.9, 0.99, 1.0])
    adv, ret = skip_observation_gae(v, r, m, gamma=1.0, lam=lam)
    for row in range(5):
        sel = m[row]
        compact_adv, compact_ret = skip_observation_gae(v[row][sel][None], r[row][sel][None],
                                                        torch.ones(1, int(sel.sum()), dtype=torch.bool),
                                                        gamma=1.0, lam=float(lam[row]))
        torch.testing.assert_close(adv[row][sel], compact_adv[0], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(ret[row][sel], compact_ret[0], atol=1e-6, rtol=1e-6)
        assert (adv[row][~sel] == 0).all() and (ret[row][~sel] == 0).all()


def test_observation_values_are_ignored():
    rng = random.Random(2)
    values, rewards, masks = make_batch(rng, rows=3, length=100)
    v, r, m = torch.tensor(values), torch.tensor(rewards), torch.tensor(masks)
    noisy = torch.where(m, v, torch.randn_like(v) * 100)
    a1, g1 = skip_observation_gae(v, r, m, 1.0, 0.9)
    a2, g2 = skip_observation_gae(noisy, r, m, 1.0, 0.9)
    assert torch.equal(a1, a2) and torch.equal(g1, g2)


def test_terminal_reward_propagates_from_last_action_token():
    # three action segments separated by observations; V = 0, R = 1 on the last action token:
    # with gamma = lambda = 1 every action token gets A = G = 1; with lambda = 0.5, A_k = 0.5^(K-k)
    mask = torch.tensor([[False, True, True, False, False, True, False, True, False]])
    rewards = torch.zeros(1, 9)
    rewards[0, 7] = 1.0
    adv, ret = skip_observation_gae(torch.zeros(1, 9), rewards, mask, 1.0, 1.0)
    assert adv[0].tolist() == [0, 1, 1, 0, 0, 1, 0, 1, 0]
    assert ret[0].tolist() == [0, 1, 1, 0, 0, 1, 0, 1, 0]
    adv, _ = skip_observation_gae(torch.zeros(1, 9), rewards, mask, 1.0, 0.5)
    assert adv[0].tolist() == [0, 0.125, 0.25, 0, 0, 0.5, 0, 1.0, 0]


def test_reward_on_observation_token_is_rejected():
    mask = torch.tensor([[False, True, True, False]])
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]])  # on the trailing observation token
    with pytest.raises(ValueError, match=r"reward.*position 3"):
        skip_observation_gae(torch.zeros(1, 4), rewards, mask)
    with pytest.raises(ValueError, match="reward"):  # token GAE rejects a reward on padding
        token_gae(torch.zeros(1, 4), rewards, torch.tensor([[True, True, True, False]]))


def test_length_adaptive_lambda_per_row():
    lam = length_adaptive_lambda(torch.tensor([1, 2, 10, 1000, 0]), alpha=1.5)
    expected = [1 - 1 / 1.5, 1 - 1 / 3.0, 1 - 1 / 15.0, 1 - 1 / 1500.0, 0.0]
    torch.testing.assert_close(lam, torch.tensor(expected))
    assert length_adaptive_lambda([4], alpha=0.5).tolist() == [0.5]
    assert length_adaptive_lambda([1], alpha=0.5).tolist() == [0.0]  # 1 - 1/0.5 = -1, clamped
    with pytest.raises(ValueError, match="alpha"):
        length_adaptive_lambda([3], alpha=0.0)


def test_per_row_lambda_matches_reference():
    rng = random.Random(3)
    values, rewards, masks = make_batch(rng, rows=4, length=250)
    counts = [sum(m) for m in masks]
    lam = length_adaptive_lambda(counts)
    adv, ret = skip_observation_gae(torch.tensor(values), torch.tensor(rewards), torch.tensor(masks), 1.0, lam)
    for r in range(4):
        ref_adv, ref_ret = gae_reference(values[r], rewards[r], masks[r], 1.0, 1 - 1 / (1.5 * counts[r]))
        torch.testing.assert_close(adv[r], torch.tensor(ref_adv), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ret[r], torch.tensor(ref_ret), atol=1e-5, rtol=1e-5)


def test_padding_and_empty_rows():
    rng = random.Random(4)
    values, rewards, masks = make_batch(rng, rows=3, length=60)
    v, r, m = torch.tensor(values), torch.tensor(rewards), torch.tensor(masks)
    # an empty row (no action token) and more padding on the right
    v = torch.cat([torch.nn.functional.pad(v, (0, 40), value=5.0), torch.randn(1, 100)])
    r = torch.cat([torch.nn.functional.pad(r, (0, 40)), torch.zeros(1, 100)])
    m = torch.cat([torch.nn.functional.pad(m, (0, 40)), torch.zeros(1, 100, dtype=torch.bool)])
    adv, ret = skip_observation_gae(v, r, m, 1.0, 0.95)
    assert (adv[3] == 0).all() and (ret[3] == 0).all()
    assert (adv[:, 60:] == 0).all() and (ret[:, 60:] == 0).all()
    for row in range(3):
        alone, _ = skip_observation_gae(v[row:row + 1, :60], r[row:row + 1, :60], m[row:row + 1, :60], 1.0, 0.95)
        torch.testing.assert_close(adv[row, :60], alone[0])
    # every row empty, and a batch of zero tokens
    adv, ret = skip_observation_gae(torch.ones(2, 5), torch.zeros(2, 5), torch.zeros(2, 5, dtype=torch.bool))
    assert (adv == 0).all() and (ret == 0).all()
    adv, _ = skip_observation_gae(torch.ones(2, 0), torch.zeros(2, 0), torch.zeros(2, 0, dtype=torch.bool))
    assert adv.shape == (2, 0)


def test_token_gae_runs_through_observations():
    rng = random.Random(5)
    values, rewards, masks = make_batch(rng, rows=4, length=120)
    valid = [[True] * (max([i for i, a in enumerate(m) if a], default=-1) + 3) for m in masks]
    valid = [row[:120] + [False] * (120 - len(row[:120])) for row in valid]
    adv, ret = token_gae(torch.tensor(values), torch.tensor(rewards), torch.tensor(valid), 1.0, 0.95)
    for r in range(4):
        ref_adv, ref_ret = gae_reference(values[r], rewards[r], valid[r], 1.0, 0.95)
        torch.testing.assert_close(adv[r], torch.tensor(ref_adv), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ret[r], torch.tensor(ref_ret), atol=1e-5, rtol=1e-5)
    # and it differs from the skipping estimator as soon as observation values matter
    skip, _ = skip_observation_gae(torch.tensor(values), torch.tensor(rewards), torch.tensor(masks), 1.0, 0.95)
    assert not torch.allclose(adv * torch.tensor(masks), skip)


@pytest.mark.parametrize("length", [1, 2, 3, 63, 64, 65, 4097, 9000])
def test_two_level_scan_matches_loop(length):
    g = torch.Generator().manual_seed(length)
    x = torch.randn(4, length, generator=g, dtype=torch.float64)
    discount = torch.tensor([0.0, 0.3, 0.999, 1.0], dtype=torch.float64)
    y = discounted_reverse_cumsum(x, discount)
    for row in range(4):
        acc, ref = 0.0, [0.0] * length
        for k in reversed(range(length)):
            acc = x[row, k].item() + discount[row].item() * acc
            ref[k] = acc
        torch.testing.assert_close(y[row], torch.tensor(ref, dtype=torch.float64), atol=1e-9, rtol=1e-9)


def test_output_is_fp32_and_inputs_are_checked():
    mask = torch.tensor([[False, True, True]])
    adv, ret = skip_observation_gae(torch.zeros(1, 3, dtype=torch.bfloat16), torch.zeros(1, 3), mask)
    assert adv.dtype == torch.float32 and ret.dtype == torch.float32
    with pytest.raises(ValueError, match="action_mask must be a bool"):
        skip_observation_gae(torch.zeros(1, 3), torch.zeros(1, 3), mask.long())
    with pytest.raises(ValueError, match="same shape"):
        skip_observation_gae(torch.zeros(1, 3), torch.zeros(1, 4), mask)
    with pytest.raises(ValueError, match=r"lam must lie in \[0, 1\]"):
        skip_observation_gae(torch.zeros(1, 3), torch.zeros(1, 3), mask, lam=1.5)
    with pytest.raises(ValueError, match="lam must be a float or a tensor of shape"):
        skip_observation_gae(torch.zeros(1, 3), torch.zeros(1, 3), mask, lam=torch.tensor([0.5, 0.5]))
    with pytest.raises(ValueError, match="gamma"):
        skip_observation_gae(torch.zeros(1, 3), torch.zeros(1, 3), mask, gamma=1.1)
