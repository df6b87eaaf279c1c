"""trainer.attn_impl: the attention of packed rows (trainer.modeling.models.use_packed_attention).

flex (FlexAttention under a document BlockMask) against the per-trajectory reference: each trajectory alone
through the model on plain "sdpa". FlexAttention has no backward on CPU (torch 2.13), so its gradients are
checked on CUDA only; flash_varlen needs CUDA and flash_attn.
"""
from __future__ import annotations

import pytest
import torch

from sao_harness.trainer.config import TrainerConfig
from sao_harness.trainer.modeling.models import (
    PACKED_FLEX,
    PACKED_SDPA,
    policy_token_logprobs,
    resolve_attn_impl,
    use_packed_attention,
)
from tests.support.trainer_data import VOCAB, make_trainer, tiny_policy
from tests.trainer.test_fidelity_fixes import LENGTHS, WINDOW, hf_logprobs, packed, windowed_qwen3

CUDA = torch.cuda.is_available()
FLASH = CUDA and resolve_attn_impl("auto", "cuda") == "flash_varlen"


def trajectories(lengths, vocab: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=gen) for n in lengths]


def logp_and_grads(model, *args, **kwargs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """policy_token_logprobs(model, *args, **kwargs) and the gradients of their sum."""
    logp, _ = policy_token_logprobs(model, *args, **kwargs)
    logp.sum().backward()
    return logp.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def assert_same(got, want, **tolerance) -> None:
    (logp, grads), (ref_logp, ref_grads) = got, want
    torch.testing.assert_close(logp, ref_logp, **tolerance)
    assert grads.keys() == ref_grads.keys() and grads
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], **tolerance, msg=name)


def packed_vs_alone(model, ref_model, trajs, device="cpu"):
    """(packed logprobs at the action tokens, the same logprobs of each trajectory alone on ref_model)."""
    ids, positions, actions = (t.to(device) for t in packed(trajs))
    logp, _ = policy_token_logprobs(model, ids, None, actions, position_ids=positions)
    ref = torch.cat([hf_logprobs(ref_model, t.to(device)) for t in trajs])
    return logp[actions].double(), ref


@torch.no_grad()
def test_flex_packed_rows_equal_each_trajectory_alone_on_the_tiny_moe():
    """The tiny Qwen3-MoE (GQA: 4 query heads over 2 kv heads), fp32: packed on flex = alone on sdpa."""
    ref_model, model = tiny_policy().eval(), use_packed_attention(tiny_policy().eval(), "flex")
    assert model.config._attn_implementation == PACKED_FLEX
    for seed, lengths in enumerate([(11, 3, 14, 7), (20, 1, 2, 33, 9)]):  # a new length: the dynamic-shape kernel
        logp, ref = packed_vs_alone(model, ref_model, trajectories(lengths, VOCAB, seed))
        print("tiny MoE, flex vs alone: max abs logprob diff", (logp - ref).abs().max().item())
        torch.testing.assert_close(logp, ref, rtol=0, atol=1e-5)


@torch.no_grad()
def test_flex_under_bf16_autocast_matches_sdpa_packed():
    """fp32 master weights under bf16 autocast (the trainer's passes): q, k leave Qwen3's fp32 q/k norms while
    v is bf16; flex casts them to the autocast dtype, as SDPA does, and agrees with sdpa_packed to bf16."""
    ref_model, model = (use_packed_attention(tiny_policy().eval(), impl) for impl in ("sdpa_packed", "flex"))
    ids, positions, actions = packed(trajectories((11, 3, 14, 7), VOCAB, seed=7))
    with torch.autocast("cpu", torch.bfloat16):
        logp, ref = (policy_token_logprobs(m, ids, None, actions, position_ids=positions)[0]
                     for m in (model, ref_model))
    torch.testing.assert_close(logp, ref, rtol=0, atol=5e-2)


@torch.no_grad()
def test_flex_honours_the_sliding_window_of_each_layer():
    """Qwen3 with layer 0 full and layers 1, 2 windowed (window 4, shorter and longer than trajectories)."""
    ref_model, model = windowed_qwen3(), use_packed_attention(windowed_qwen3(), "flex")
    trajs = trajectories(LENGTHS, 256, seed=2)
    logp, ref = packed_vs_alone(model, ref_model, trajs)
    print("windowed Qwen3, flex vs alone: max abs logprob diff", (logp - ref).abs().max().item())
    torch.testing.assert_close(logp, ref, rtol=0, atol=1e-5)
    single, _ = policy_token_logprobs(model, trajs[2][None], None, torch.arange(LENGTHS[2])[None] > 0)
    torch.testing.assert_close(single[0, 1:].double(), hf_logprobs(ref_model, trajs[2]), rtol=0, atol=1e-5)


def test_flex_on_padded_rows_is_sdpa_and_trains_on_cpu():
    """A padded batch takes SDPA's mask and SDPA itself: the same logprobs and gradients as "sdpa"."""
    ref_model, model = windowed_qwen3(), use_packed_attention(windowed_qwen3(), "flex")
    trajs = trajectories((9, 5, 13), 256, seed=3)
    ids = torch.nn.utils.rnn.pad_sequence(trajs, batch_first=True)
    mask = torch.nn.utils.rnn.pad_sequence([torch.ones_like(t, dtype=torch.bool) for t in trajs], batch_first=True)
    actions = mask & (torch.arange(ids.shape[1]) > 0)
    assert_same(logp_and_grads(model, ids, mask, actions), logp_and_grads(ref_model, ids, mask, actions),
                rtol=0, atol=0)


@torch.no_grad()
def test_the_flex_kernel_call_equals_sdpa_packed_with_scaling_gqa_and_a_window():
    """The attention function alone on a packed row (4 query heads over 2 kv heads, scaling 0.3), full and
    windowed: FlexAttention under document_block_mask == sdpa_packed's per-trajectory SDPA."""
    from sao_harness.trainer.modeling.models import _packed_flex_attention, _packed_sdpa_attention

    positions = torch.cat([torch.arange(n) for n in LENGTHS])[None]
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, h, positions.shape[1], 8, generator=gen) for h in (4, 2, 2))
    for window in (None, WINDOW, 1):
        out, _ = _packed_flex_attention(torch.nn.Module(), q, k, v, None, scaling=0.3, position_ids=positions,
                                        sliding_window=window)
        ref, _ = _packed_sdpa_attention(torch.nn.Module(), q, k, v, None, scaling=0.3, position_ids=positions,
                                        sliding_window=window)
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)


def test_flex_has_no_backward_on_cpu_and_says_so():
    model = use_packed_attention(tiny_policy(), "flex")
    ids, positions, actions = packed(trajectories((6, 5), VOCAB))
    with pytest.raises(NotImplementedError, match=r"trainer\.attn_impl=flex: .*no backward on CPU.*sdpa_packed"):
        policy_token_logprobs(model, ids, None, actions, position_ids=positions)


def test_auto_selects_what_it_says_on_this_machine(monkeypatch):
    import sao_harness.trainer.modeling.models as models

    assert resolve_attn_impl("auto", "cpu") == "sdpa_packed"  # flex cannot train on CPU
    model = use_packed_attention(tiny_policy(), "auto")
    expected = {"sdpa_packed": PACKED_SDPA, "flex": PACKED_FLEX, "flash_varlen": "flash_attention_2"}[
        resolve_attn_impl("auto", next(model.parameters()).device)]
    assert model.config._attn_implementation == expected == PACKED_SDPA  # the tests' models are on CPU
    monkeypatch.setattr(models, "_flash_attn_importable", lambda: True)
    assert resolve_attn_impl("auto", "cuda") == "flash_varlen"
    monkeypatch.setattr(models, "_flash_attn_importable", lambda: False)
    assert resolve_attn_impl("auto", "cuda:0") == "flex"


def test_flash_varlen_without_cuda_or_flash_attn_is_an_error_naming_the_setting(monkeypatch):
    import sao_harness.trainer.modeling.models as models

    with pytest.raises(ValueError, match=r"trainer\.attn_impl=flash_varlen needs the model on CUDA"):
        use_packed_attention(tiny_policy(), "flash_varlen")
    monkeypatch.setattr(models, "_flash_attn_importable", lambda: False)
    with pytest.raises(ValueError, match=r"trainer\.attn_impl=flash_varlen needs the flash_attn package"):
        resolve_attn_impl("flash_varlen", "cuda")
    with pytest.raises(ValueError, match="attn_impl"):
        TrainerConfig(attn_impl="flash")


def test_the_trainer_runs_config_attn_impl_and_switches_between_them():
    trainer = make_trainer(attn_impl="flex")
    assert trainer.policy.config._attn_implementation == PACKED_FLEX
    assert trainer.critic.backbone.config._attn_implementation == PACKED_FLEX
    for impl, name in (("sdpa_packed", PACKED_SDPA), ("flex", PACKED_FLEX), ("auto", PACKED_SDPA)):
        assert use_packed_attention(trainer.policy, impl).config._attn_implementation == name
    assert TrainerConfig().attn_impl == "auto"
    with pytest.raises(ValueError, match="flash_varlen"):
        make_trainer(attn_impl="flash_varlen")


@pytest.mark.skipif(not CUDA, reason="FlexAttention has no backward on CPU (torch 2.13): gradients need CUDA")
def test_flex_gradients_equal_sdpa_packed_on_cuda():
    """fp32 on CUDA: the packed forward's and backward's of flex = those of sdpa_packed."""
    ref_model, model = (use_packed_attention(windowed_qwen3().cuda(), impl) for impl in ("sdpa_packed", "flex"))
    ids, positions, actions = (t.cuda() for t in packed(trajectories(LENGTHS, 256, seed=4)))
    assert_same(logp_and_grads(model, ids, None, actions, position_ids=positions),
                logp_and_grads(ref_model, ids, None, actions, position_ids=positions), rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not FLASH, reason="flash_varlen needs CUDA and the flash_attn package")
@torch.no_grad()
def test_flash_varlen_packed_rows_equal_each_trajectory_alone():
    """bf16 (flash-attention has no fp32): packed on flash_attention_2 varlen = alone on sdpa, to bf16."""
    ref_model = windowed_qwen3().cuda().to(torch.bfloat16)
    model = use_packed_attention(windowed_qwen3().cuda().to(torch.bfloat16), "flash_varlen")
    assert model.config._attn_implementation == "flash_attention_2"
    logp, ref = packed_vs_alone(model, ref_model, trajectories(LENGTHS, 256, seed=6), device="cuda")
    torch.testing.assert_close(logp, ref, rtol=0, atol=5e-2)
