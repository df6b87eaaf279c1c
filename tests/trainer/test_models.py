"""Chunked logprobs vs the full computation, the critic, and parameter freezing."""
from __future__ import annotations

import pytest
import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from sao_harness.trainer.modeling.models import (
    Critic,
    chunked_token_logprobs,
    critic_freeze_patterns,
    freeze_parameters,
    load_critic,
    policy_token_logprobs,
    save_critic,
)


def tiny_policy(seed=0, **overrides):
    torch.manual_seed(seed)
    config = Qwen3MoeConfig(**(dict(vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                    num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1,
                                    max_position_embeddings=4096) | overrides))
    return Qwen3MoeForCausalLM(config)


def full_reference(hidden, weight, targets, temperature, top_k, top_p):
    """Full [N, V] logits through transformers' own sampling warpers (the hf engine's distribution)."""
    scores = hidden @ weight.T
    scores = TemperatureLogitsWarper(temperature)(None, scores)
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    logq = torch.log_softmax(scores, -1)
    q = logq.exp()
    entropy = -(q * torch.where(torch.isfinite(logq), logq, 0.0)).sum(-1)
    return logq.gather(-1, targets[:, None]).squeeze(-1), entropy


SAMPLING = [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 20, 1.0), (0.9, 0, 0.8), (0.8, 50, 0.9)]


@pytest.mark.parametrize("temperature,top_k,top_p", SAMPLING)
def test_chunked_logprobs_equal_full_computation_and_gradient(temperature, top_k, top_p):
    torch.manual_seed(1)
    n, h, v = 203, 32, 300
    hidden = (torch.randn(n, h) * 0.3).requires_grad_()  # logits of std ~1.7: top-p keeps many tokens
    weight = torch.randn(v, h).requires_grad_()
    # targets: sampled from the filtered distribution, so every logp is finite
    targets = torch.multinomial(full_probs(hidden, weight, temperature, top_k, top_p), 1)[:, 0]
    ref_logp, ref_entropy = full_reference(hidden, weight, targets, temperature, top_k, top_p)
    logp, entropy = chunked_token_logprobs(hidden, weight, targets, temperature=temperature, top_k=top_k,
                                           top_p=top_p, chunk_size=64)
    torch.testing.assert_close(logp, ref_logp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy, ref_entropy, atol=1e-5, rtol=1e-5)
    coef = torch.randn(n)
    ref_grads = torch.autograd.grad((coef * ref_logp).sum() + ref_entropy.sum(), [hidden, weight])
    grads = torch.autograd.grad((coef * logp).sum() + entropy.sum(), [hidden, weight])
    for g, e in zip(grads, ref_grads):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


def full_probs(hidden, weight, temperature, top_k, top_p):
    with torch.no_grad():
        scores = TemperatureLogitsWarper(temperature)(None, hidden @ weight.T)
        if top_k:
            scores = TopKLogitsWarper(top_k)(None, scores)
        if top_p < 1.0:
            scores = TopPLogitsWarper(top_p)(None, scores)
        return scores.softmax(-1)


def test_filtered_tokens_get_minus_inf_and_no_nan_gradient():
    torch.manual_seed(2)
    hidden, weight = torch.randn(10, 8).requires_grad_(), torch.randn(50, 8).requires_grad_()
    worst = (hidden @ weight.T).argmin(-1).detach()  # never in the top 5
    logp, entropy = chunked_token_logprobs(hidden, weight, worst, top_k=5, chunk_size=3)
    assert torch.isneginf(logp).all() and torch.isfinite(entropy).all()
    entropy.sum().backward()
    assert torch.isfinite(hidden.grad).all() and torch.isfinite(weight.grad).all()


def test_chunking_never_holds_more_than_one_chunk_of_logits(monkeypatch):
    """Logits are built chunk by chunk, at most chunk_size positions each, forward and backward."""
    import sao_harness.trainer.modeling.models as models
    seen = []
    real = models._chunk_logits

    def spy(hidden, weight, bias, out, sampling):
        seen.append((hidden.shape[0], tuple(out.shape)))
        return real(hidden, weight, bias, out, sampling)

    monkeypatch.setattr(models, "_chunk_logits", spy)
    hidden, weight = torch.randn(100, 8, requires_grad=True), torch.randn(40, 8, requires_grad=True)
    logp, _ = chunked_token_logprobs(hidden, weight, torch.zeros(100, dtype=torch.long), chunk_size=16)
    n_forward = len(seen)
    logp.sum().backward()
    assert n_forward == 7 and len(seen) == 14  # recomputed in backward, chunk by chunk
    assert max(rows for rows, _ in seen) == 16 and {buf for _, buf in seen} == {(16, 40)}
    empty, _ = chunked_token_logprobs(torch.zeros(0, 8, requires_grad=True), weight, torch.zeros(0, dtype=torch.long))
    assert empty.shape == (0,)


def test_policy_token_logprobs_match_model_logits():
    policy = tiny_policy()
    torch.manual_seed(3)
    input_ids = torch.randint(0, 512, (2, 12))
    attention_mask = torch.ones(2, 12, dtype=torch.bool)
    attention_mask[1, 9:] = False  # padding
    action_mask = torch.zeros(2, 12, dtype=torch.bool)
    action_mask[0, [3, 4, 5, 9, 10]] = True
    action_mask[1, [2, 6, 7]] = True
    logp, entropy = policy_token_logprobs(policy, input_ids, attention_mask, action_mask, temperature=0.8, chunk_size=2)
    logits = policy(input_ids=input_ids, attention_mask=attention_mask.long()).logits / 0.8
    ref = torch.log_softmax(logits[:, :-1], -1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    ref = torch.nn.functional.pad(ref, (1, 0)) * action_mask
    torch.testing.assert_close(logp, ref, atol=1e-5, rtol=1e-5)
    assert (entropy[~action_mask] == 0).all() and (entropy[action_mask] > 0).all()
    with pytest.raises(ValueError, match="position 0"):
        policy_token_logprobs(policy, input_ids, attention_mask, torch.ones(2, 12, dtype=torch.bool))


def test_critic_from_policy_reads_the_predicting_position_and_round_trips(tmp_path):
    policy = tiny_policy()
    critic = Critic.from_policy(policy)
    for name, p in policy.model.named_parameters():
        assert torch.equal(p, dict(critic.backbone.named_parameters())[name])
    assert not any("lm_head" in n for n, _ in critic.named_parameters())
    assert critic.value_head.weight.shape == (1, 64)
    torch.nn.init.normal_(critic.value_head.weight)
    ids = torch.randint(0, 512, (1, 10))
    values = critic(ids)
    assert values.shape == (1, 10) and values.dtype == torch.float32 and values[0, 0] == 0
    hidden = policy.model(input_ids=ids).last_hidden_state
    torch.testing.assert_close(values[0, 1:], critic.value_head(hidden[0, :-1]).squeeze(-1))
    changed = ids.clone()
    changed[0, 6] = (ids[0, 6] + 1) % 512  # V at token t depends only on tokens before t
    assert torch.equal(critic(changed)[0, :7], values[0, :7])
    save_critic(critic, tmp_path / "critic")
    loaded = load_critic(tmp_path / "critic")
    torch.testing.assert_close(loaded(ids), values)
    assert (tmp_path / "critic" / "critic.safetensors").is_file()
    with pytest.raises(ValueError, match="critic.safetensors"):
        load_critic(tmp_path)


def test_critic_from_pretrained_policy_checkpoint(tmp_path):
    policy = tiny_policy()
    policy.save_pretrained(tmp_path / "policy")
    critic = Critic.from_pretrained(str(tmp_path / "policy"))
    for name, p in policy.model.named_parameters():
        assert torch.equal(p, dict(critic.backbone.named_parameters())[name])


def test_attention_freezing_preset():
    critic = Critic.from_policy(tiny_policy())
    frozen = set(freeze_parameters(critic, critic_freeze_patterns("attention")))
    names = dict(critic.named_parameters())
    assert {n for n in names if ".self_attn." in n} <= frozen  # q/k/v/o and q/k norms
    assert {n for n in names if n.endswith("mlp.gate.weight")} <= frozen  # router
    assert {n for n in names if "layernorm" in n or n == "backbone.norm.weight"} <= frozen
    assert "backbone.embed_tokens.weight" in frozen
    trainable = {n for n, p in names.items() if p.requires_grad}
    experts = {f"backbone.layers.{i}.mlp.experts.{w}" for i in range(2) for w in ("gate_up_proj", "down_proj")}
    assert trainable == experts | {"value_head.weight", "value_head.bias"}
    # switches: router / norms / embeddings trainable
    critic = Critic.from_policy(tiny_policy())
    frozen = set(freeze_parameters(critic, critic_freeze_patterns("attention", norms=False, router=False,
                                                                   embeddings=False)))
    assert frozen == {n for n in names if ".self_attn." in n}
    assert critic_freeze_patterns("none") == []
    with pytest.raises(ValueError, match="matches no parameter"):
        freeze_parameters(torch.nn.Linear(2, 2), critic_freeze_patterns("attention"))


def test_router_pattern_spares_a_dense_mlp_gate_proj():
    critic = Critic.from_policy(tiny_policy(mlp_only_layers=[1]))  # layer 1: dense MLP (gate_proj/up/down)
    frozen = set(freeze_parameters(critic, critic_freeze_patterns("attention")))
    assert "backbone.layers.0.mlp.gate.weight" in frozen
    assert not any(".mlp.gate_proj" in n or ".mlp.up_proj" in n or ".mlp.down_proj" in n for n in frozen)
    assert critic.backbone.layers[1].mlp.gate_proj.weight.requires_grad


def test_chunked_logprobs_match_the_engine_sampling_rule():
    """The trainer recomputes the distribution the engine samples from (harness.engines.sampling)."""
    sampling = pytest.importorskip("sao_harness.harness.engines.sampling")
    torch.manual_seed(4)
    hidden, weight = torch.randn(37, 16) * 0.3, torch.randn(200, 16)
    for temperature, top_k, top_p in SAMPLING:
        engine = sampling.sampling_logprobs(hidden @ weight.T, temperature, top_p=top_p, top_k=top_k)
        targets = torch.multinomial(engine.exp(), 1)[:, 0]
        logp, _ = chunked_token_logprobs(hidden, weight, targets, temperature=temperature, top_k=top_k,
                                         top_p=top_p, chunk_size=8)
        torch.testing.assert_close(logp, engine.gather(-1, targets[:, None]).squeeze(-1), atol=1e-5, rtol=1e-5)
        dropped = torch.isneginf(engine).float().argmax(-1)  # a filtered token of each row (if any)
        has_dropped = torch.isneginf(engine).any(-1)
        logp_dropped, _ = chunked_token_logprobs(hidden, weight, dropped, temperature=temperature, top_k=top_k,
                                                 top_p=top_p, chunk_size=8)
        assert torch.isneginf(logp_dropped[has_dropped]).all()


def test_frozen_parameters_get_no_gradient_and_do_not_move():
    critic = Critic.from_policy(tiny_policy())
    torch.nn.init.normal_(critic.value_head.weight, std=0.1)
    freeze_parameters(critic, critic_freeze_patterns("attention"))
    before = {n: p.detach().clone() for n, p in critic.named_parameters()}
    optimizer = torch.optim.AdamW([p for p in critic.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.1)
    (critic(torch.randint(0, 512, (2, 16))) ** 2).mean().backward()
    optimizer.step()
    for name, p in critic.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and not torch.equal(p, before[name]), name
        else:
            assert p.grad is None and torch.equal(p, before[name]), name
