"""Routing replay (trainer.router_replay): the engine records the experts its routers chose, the proxy keeps
them token for token in the trace, and the trainer's policy forward takes them.

References: the MoE block's own experts called with the given experts and the gate weights of the
trainer's router (the replay equation, computed by hand); the model's own full forward (RouteRecorder),
whose routes a replay must reproduce exactly and the engine's and the trace's must equal.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from sao_harness.harness.engines.hf import HFEngine
from sao_harness.harness.engines.protocol import SamplingParams
from sao_harness.harness.engines.routes import NO_ROUTE, RouteRecorder
from sao_harness.harness.proxy import ProxyServer
from sao_harness.harness.store import TraceStore, read_shard
from sao_harness.harness.tiny_model import ensure_tiny_model
from sao_harness.sao.config import load_config
from sao_harness.trainer.algo.sao import SAOTrainer
from sao_harness.trainer.config import TrainerConfig
from sao_harness.trainer.modeling.models import Critic
from sao_harness.trainer.modeling.router_replay import RouterReplay
from tests.support.trainer_data import synthetic_trajectories, tiny_policy

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "sao"


@pytest.fixture(scope="module")
def model_path():
    return str(ensure_tiny_model(CACHE))


def own_routes(model, ids: list[int]) -> np.ndarray:
    """The routes of the model's own forward over ids: [len(ids), layers, top_k]."""
    recorder = RouteRecorder(model)
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]))
        return recorder.take()
    finally:
        recorder.remove()


def other_experts(routes: np.ndarray, num_experts: int) -> np.ndarray:
    """Each route's complement: the experts it did not choose (top_k = E / 2 here), none in common with it."""
    everyone = np.arange(num_experts)
    flat = routes.reshape(-1, routes.shape[-1])
    out = np.stack([np.setdiff1d(everyone, row) for row in flat])
    return out.reshape(routes.shape).astype(np.int16)


def test_a_replayed_moe_block_is_the_given_experts_with_the_trainers_gate_weights():
    torch.manual_seed(0)
    policy = tiny_policy()
    replay = RouterReplay(policy)
    block = policy.model.layers[1].mlp
    hidden = torch.randn(1, 7, policy.config.hidden_size)
    experts = torch.stack([torch.randperm(4)[:2] for _ in range(7)])  # [tokens, top_k], distinct per token
    routes = torch.full((7, 2, 2), NO_ROUTE, dtype=torch.int16)
    routes[:, 1] = experts
    flat = hidden.view(7, -1)
    probs = torch.softmax(flat @ block.gate.weight.T, dim=-1)
    for normalise in (False, True):  # Qwen3-MoE's norm_topk_prob: the gate weights renormalised over the top-k
        block.gate.norm_topk_prob = normalise
        with replay.replaying(routes):
            out = block(hidden)
        weights = probs.gather(-1, experts)
        weights = weights / weights.sum(-1, keepdim=True) if normalise else weights
        reference = block.experts(flat, experts, weights).view(1, 7, -1)
        assert torch.allclose(out, reference, atol=1e-7)
        assert not torch.allclose(block(hidden), reference, atol=1e-5)  # the trainer's own choice is another


def test_replaying_the_models_own_routes_is_its_own_forward_and_other_routes_are_not(model_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    ids = list(range(20, 60))
    routes = own_routes(model, ids)
    replay = RouterReplay(model)
    x = torch.tensor([ids])

    def logits_and_router_grad(r):
        model.zero_grad()
        with replay.replaying(None if r is None else torch.from_numpy(r)):
            logits = model(input_ids=x).logits
            logits.log_softmax(-1)[0, :-1].gather(-1, x[0, 1:, None]).sum().backward()
        return logits.detach(), model.model.layers[0].mlp.gate.weight.grad.clone()

    native, native_grad = logits_and_router_grad(None)
    same, same_grad = logits_and_router_grad(routes)
    agree, choices = replay.agreement()
    assert agree == choices > 0
    assert torch.equal(same, native) and torch.allclose(same_grad, native_grad, atol=1e-7)
    assert same_grad.abs().sum() > 0  # the router still trains under replay
    other, _ = logits_and_router_grad(other_experts(routes, 4))
    agree, choices = replay.agreement()
    assert agree <= 0.5 * choices  # layer 0 agrees on none (layer 1 sees other inputs)
    assert (other - native).abs().max() > 1e-3


def test_the_hf_engine_returns_the_routes_of_the_positions_it_was_asked_for(model_path):
    from transformers import AutoModelForCausalLM

    engine = HFEngine(model_path)
    try:
        prompt = list(range(10, 40))
        results = [engine.generate(prompt, SamplingParams(max_tokens=6, seed=3, routes_from=start)) for start in (0, 5)]
        plain = engine.generate(prompt, SamplingParams(max_tokens=6, seed=3))
    finally:
        engine.close()
    reference = own_routes(AutoModelForCausalLM.from_pretrained(model_path), prompt + results[0].token_ids[:-1])
    assert results[0].token_ids == results[1].token_ids == plain.token_ids  # recording changes no sample
    assert np.array_equal(results[0].routes, reference)  # prompt + tokens - 1 rows
    assert np.array_equal(results[1].routes, reference[5:])
    assert plain.routes is None


def test_the_trace_holds_one_route_per_token_across_turns_and_parquet(model_path, tmp_path):
    """Three turns through the proxy; each token's route is the one of the turn that first fed it (no
    weight update here, so it equals the model's own forward over the whole trace), the last token's -1."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = load_config(None, ["sampling.max_tokens=5", f"model.cache_dir={CACHE}"])
    engine = HFEngine(model_path)
    proxy = ProxyServer(engine, AutoTokenizer.from_pretrained(model_path), cfg, store=TraceStore(tmp_path))
    try:
        session = proxy.session("ep", "task")
        messages = [{"role": "system", "content": "You write code."}, {"role": "user", "content": "Begin."}]
        for turn in range(3):
            reply = session.complete({"messages": messages, "seed": turn})["choices"][0]["message"]
            messages += [{"role": "assistant", "content": reply["content"]},
                         {"role": "user", "content": f"More {turn}."}]
        traj, path = proxy.close_and_store("ep")
    finally:
        engine.close()
    ids = traj.token_ids
    reference = own_routes(AutoModelForCausalLM.from_pretrained(model_path), ids)
    assert traj.metadata["routes"] == "recorded" and not traj.breaks
    assert traj.routed_experts.shape == (len(ids), 2, 2)
    assert np.array_equal(traj.routed_experts[:-1], reference[:-1])
    assert (traj.routed_experts[-1] == NO_ROUTE).all()
    back = next(t for t in read_shard(path) if t.traj_id == traj.traj_id)
    assert np.array_equal(back.routed_experts, traj.routed_experts)


def routed(trajectories, policy):
    """The trajectories with the routes of the policy's own forward over each."""
    return [dataclasses.replace(t, routed_experts=own_routes(policy, t.token_ids)) for t in trajectories]


def trainer(policy, mode, **config):
    config = TrainerConfig(lr=1e-3, critic_lr=1e-3, critic_warmup_steps=0, max_staleness=100, router_replay=mode,
                           **config)
    return SAOTrainer(policy, Critic.from_policy(policy), config)


def test_replay_on_trains_traces_with_routes_and_refuses_one_without():
    policy = tiny_policy()
    batch = routed(synthetic_trajectories(6), policy)
    metrics = trainer(policy, "on").update(batch)
    assert metrics["policy/trained"] == 1.0 and metrics["rollout/route_agreement"] == 1.0
    stripped = [dataclasses.replace(batch[0], routed_experts=None), *batch[1:]]
    with pytest.raises(ValueError, match=r"trajectory .*no routed_experts.*router_replay=on"):
        trainer(tiny_policy(), "on").update(stripped)
    assert trainer(tiny_policy(), "auto").update(stripped)["policy/trained"] == 1.0  # auto: unreplayed
    wrong = [dataclasses.replace(batch[0], routed_experts=batch[0].routed_experts[:, :1]), *batch[1:]]
    with pytest.raises(ValueError, match="another model's routes"):
        trainer(tiny_policy(), "auto").update(wrong)
    with pytest.raises(ValueError, match="no MoE router"):
        from transformers import Qwen3Config, Qwen3ForCausalLM
        dense = Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=1, head_dim=16))
        trainer(dense, "on")


def test_the_update_trains_on_the_replayed_computation():
    """Routes other than the policy's own: replay on computes the logprobs on them (they differ from the
    unreplayed ones, which replay off computes), and off still measures the agreement."""
    policy = tiny_policy()
    batch = [dataclasses.replace(t, routed_experts=other_experts(own_routes(policy, t.token_ids), 4))
             for t in routed(synthetic_trajectories(6), policy)]
    on, off = trainer(tiny_policy(), "on").update(batch), trainer(tiny_policy(), "off").update(batch)
    assert off["rollout/route_agreement"] == 0.0 and on["rollout/route_agreement"] <= 0.5
    assert abs(on["policy/logp_abs_diff_mean"] - off["policy/logp_abs_diff_mean"]) > 1e-4


def test_activation_checkpointing_recomputes_on_the_replayed_routes():
    """Checkpointed layers recompute their forward in backward: on the replayed routes too, so the step is the
    one without checkpointing (a recompute on the trainer's own routes would give other gradients)."""
    policy = tiny_policy()
    batch = [dataclasses.replace(t, routed_experts=other_experts(own_routes(policy, t.token_ids), 4))
             for t in routed(synthetic_trajectories(6), policy)]
    steps = {}
    for checkpointing in (False, True):
        t = trainer(tiny_policy(), "on", gradient_checkpointing=checkpointing)
        t.update(batch)
        steps[checkpointing] = {k: v.detach().clone() for k, v in t.policy.state_dict().items()}
    start = tiny_policy().state_dict()
    for name, value in steps[False].items():
        assert torch.allclose(steps[True][name], value, atol=1e-6), name
    assert any((steps[False][k] - start[k]).abs().max() > 1e-4 for k in start)  # the step moved the weights
