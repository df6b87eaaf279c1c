"""The shared sampling rule: logits / T -> top-k -> top-p (renormalised); T = 0 is greedy."""
import math

import pytest
import torch

from sao_harness.harness.engines.protocol import SamplingParams, find_stop
from sao_harness.harness.engines.sampling import sample_token, sampling_logprobs


def test_plain_temperature_is_log_softmax_of_scaled_logits():
    logits = torch.tensor([[1.0, 2.0, 3.0, -1.0]])
    lp = sampling_logprobs(logits, 0.5)
    assert torch.allclose(lp, torch.log_softmax(logits / 0.5, -1))
    assert torch.allclose(lp.exp().sum(-1), torch.ones(1))


def test_top_k_keeps_k_largest_and_renormalises():
    logits = torch.tensor([0.0, 5.0, 1.0, 4.0, 2.0])
    lp = sampling_logprobs(logits, 1.0, top_k=2)
    kept = torch.isfinite(lp)
    assert kept.tolist() == [False, True, False, True, False]
    assert torch.allclose(lp[kept], torch.log_softmax(torch.tensor([5.0, 4.0]), -1))


def test_top_p_keeps_smallest_set_reaching_p():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()
    lp = sampling_logprobs(logits, 1.0, top_p=0.75)  # 0.5 + 0.3 >= 0.75: two tokens
    assert torch.isfinite(lp).tolist() == [True, True, False, False]
    assert math.isclose(lp[0].exp().item(), 0.5 / 0.8, rel_tol=1e-5)
    lp = sampling_logprobs(logits, 1.0, top_p=0.9)  # 0.5 + 0.3 + 0.15 >= 0.9
    assert torch.isfinite(lp).tolist() == [True, True, True, False]
    lp = sampling_logprobs(logits, 1.0, top_p=0.01)  # the most likely token always stays
    assert torch.isfinite(lp).tolist() == [True, False, False, False]
    assert lp[0].item() == pytest.approx(0.0, abs=1e-6)


def test_order_is_temperature_then_top_k_then_top_p():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0])
    lp = sampling_logprobs(logits, 2.0, top_p=0.7, top_k=3)
    scaled = torch.log_softmax(logits[:3] / 2.0, -1).exp()  # after T and top-k: 3 tokens
    keep = (scaled.cumsum(0) - scaled) < 0.7  # smallest prefix reaching 0.7
    expect = torch.full((5,), float("-inf"))
    expect[:3][keep] = torch.log_softmax((logits[:3] / 2.0)[keep], -1)
    assert torch.allclose(lp, expect)


def test_greedy_is_argmax_with_t1_logprob():
    logits = torch.tensor([0.1, 2.0, 0.5])
    tok, lp = sample_token(logits, 0.0, top_p=0.5, top_k=1)
    assert tok == 1
    assert lp == pytest.approx(torch.log_softmax(logits, -1)[1].item())


def test_sampling_is_seeded_and_in_support():
    logits = torch.randn(100, generator=torch.Generator().manual_seed(0))
    a = [sample_token(logits, 0.8, 0.9, 20, torch.Generator().manual_seed(5)) for _ in range(3)]
    assert a[0] == a[1] == a[2]
    support = torch.isfinite(sampling_logprobs(logits, 0.8, 0.9, 20))
    g = torch.Generator().manual_seed(1)
    for _ in range(50):
        tok, lp = sample_token(logits, 0.8, 0.9, 20, g)
        assert support[tok] and lp <= 0


def test_sampling_params_validate():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    assert find_stop("abc</function>x</f", ("</f", "x")) == (3, "</f")
    assert find_stop("abc", ("z",)) is None
