"""Against the installed vLLM's own code: the fused-expert names we send, the engine-argument field list we ship."""
from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from sao_harness.harness.engines.vllm_args import check_vllm_args, shipped_fields
from sao_harness.harness.engines.vllm_weights import pack, plan, to_checkpoint_names, unpack


def transformers_moe_state(num_experts=4, inter=6, hidden=5):
    """A Qwen3-MoE state dict as transformers 5 holds it (fused experts), built by transformers itself."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(vocab_size=32, hidden_size=hidden * 4, intermediate_size=16, moe_intermediate_size=inter,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                         num_experts=num_experts, num_experts_per_tok=2)
    model = Qwen3MoeForCausalLM(cfg)
    return model, cfg


def test_fused_experts_map_to_the_names_vllms_expert_mapping_loads():
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

    model, cfg = transformers_moe_state()
    sd = model.state_dict()
    assert "model.layers.0.mlp.experts.gate_up_proj" in sd  # transformers 5: fused
    mapped = dict(to_checkpoint_names(sd, "qwen3_moe"))
    mapping = RoutedExperts.build_expert_params_mapping("gate_proj", "down_proj", "up_proj", cfg.num_experts)
    covered = set()
    for name in mapped:
        if ".mlp.experts." not in name:
            continue
        hits = [(p, w, e, s) for p, w, e, s in mapping if w in name]
        assert len(hits) == 1, f"{name}: matched by {hits}"
        p, w, e, shard = hits[0]
        assert int(re.search(r"experts\.(\d+)\.", name).group(1)) == e
        covered.add((e, shard))
    assert covered == {(e, s) for e in range(cfg.num_experts) for s in ("w1", "w2", "w3")}

    # the values: vLLM's w1 (gate) / w3 (up) / w2 (down) of expert e, as transformers computes them
    inter = cfg.moe_intermediate_size
    experts = model.model.layers[0].mlp.experts
    for e in range(cfg.num_experts):
        gate_up = experts.gate_up_proj[e]
        assert torch.equal(mapped[f"model.layers.0.mlp.experts.{e}.gate_proj.weight"], gate_up[:inter])
        assert torch.equal(mapped[f"model.layers.0.mlp.experts.{e}.up_proj.weight"], gate_up[inter:])
        assert torch.equal(mapped[f"model.layers.0.mlp.experts.{e}.down_proj.weight"], experts.down_proj[e])
    # save_pretrained writes the same per-expert names (the checkpoint vLLM loads at start)
    assert {n for n in mapped if ".experts." in n} <= set(_saved_names(model))


def _saved_names(model):
    import tempfile

    from safetensors import safe_open

    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        with safe_open(f"{d}/model.safetensors", "pt") as f:
            return list(f.keys())


def test_other_families_and_tensors_pass_unchanged():
    model, _ = transformers_moe_state()
    sd = model.state_dict()
    assert dict(to_checkpoint_names(sd, "qwen3")) .keys() == sd.keys()
    mapped = dict(to_checkpoint_names(sd, "qwen3_moe"))
    assert mapped["model.layers.0.mlp.gate.weight"] is sd["model.layers.0.mlp.gate.weight"]


def test_buckets_round_trip_within_the_bucket_size():
    weights = {f"w{i}": torch.randn(i + 3, 7).to(torch.bfloat16 if i % 2 else torch.float32) for i in range(9)}
    buckets = plan(weights, 256)
    assert len(buckets) > 1
    for b in buckets:
        assert b["nbytes"] <= 256 or len(b["items"]) == 1
        out = unpack(pack(weights, b, "cpu"), b)
        for name, t in out.items():
            assert torch.equal(t, weights[name])


def test_shipped_engine_arg_fields_are_the_installed_vllms():
    import vllm

    assert shipped_fields() == {f.name for f in dataclasses.fields(vllm.AsyncEngineArgs)}


def test_vllm_args_checked_at_config_time():
    from sao_harness.harness.engines.config import VLLMEngineConfig

    cfg = VLLMEngineConfig(vllm_args={"enforce_eager": True, "max_num_seqs": 4, "enable_expert_parallel": True,
                                      "kv_cache_dtype": "auto",
                                      "hf_overrides": {"rope_scaling": {"rope_type": "yarn", "factor": 2.0}}})
    assert cfg.vllm_args["max_num_seqs"] == 4
    with pytest.raises(ValueError, match="enforce_eagr.*close: enforce_eager"):
        VLLMEngineConfig(vllm_args={"enforce_eagr": True})
    with pytest.raises(ValueError, match="engine.max_model_len"):
        check_vllm_args({"max_model_len": 10})
