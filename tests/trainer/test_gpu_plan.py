"""The GPU plan (trainer.gpu_plan): parameter counts and state bytes against instantiated models, the
flagship config's plan, and refusals naming the key."""
import re

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from sao_harness.core.config import ConfigError
from sao_harness.sao.cli import main
from sao_harness.sao.config import load_config
from sao_harness.trainer.gpu_plan import (
    TRAINER_MEMORY_FRACTION,
    GiB,
    Shapes,
    critic_params,
    param_counts,
    plan,
    total_params,
    trainer_memory,
)
from sao_harness.trainer.modeling.models import Critic, critic_freeze_patterns, freeze_parameters

SMALL = dict(vocab_size=300, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, head_dim=12)
MODELS = {
    "qwen3_moe": lambda: Qwen3MoeForCausalLM(Qwen3MoeConfig(**SMALL, num_experts=4, num_experts_per_tok=2,
                                                           moe_intermediate_size=20, decoder_sparse_step=1,
                                                           mlp_only_layers=[1])),
    "qwen3_moe_step2": lambda: Qwen3MoeForCausalLM(Qwen3MoeConfig(**SMALL, num_experts=4, num_experts_per_tok=2,
                                                                 moe_intermediate_size=20, decoder_sparse_step=2)),
    "qwen3_tied": lambda: Qwen3ForCausalLM(Qwen3Config(**SMALL, tie_word_embeddings=True)),
    "qwen3_bias": lambda: Qwen3ForCausalLM(Qwen3Config(**SMALL, attention_bias=True)),
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**SMALL, attention_bias=True)),
}
KINDS = [("self_attn", r"\.self_attn\."), ("router", r"\.mlp\.gate\.weight$"), ("mlp", r"\.mlp\."),
         ("layer_norms", r"layers\.\d+\.\w+_layernorm\."), ("embed_tokens", r"embed_tokens\."),
         ("norm", r"model\.norm\."), ("lm_head", r"lm_head\.")]


def counted(model) -> dict[str, int]:
    """Parameters by kind, read off the instantiated model's named parameters (each name counted once)."""
    out = dict.fromkeys([k for k, _ in KINDS], 0) | {"layer": 0}
    for name, p in model.named_parameters():
        kind = next(k for k, pattern in KINDS if re.search(pattern, name))
        out[kind] += p.numel()
    out["layer"] = max(sum(p.numel() for p in layer.parameters()) for layer in model.model.layers)
    return out


@pytest.mark.parametrize("name", sorted(MODELS))
def test_parameter_counts_match_the_instantiated_model(name):
    model = MODELS[name]()
    shapes = Shapes.from_config(model.config)
    assert param_counts(shapes) == counted(model)
    assert total_params(param_counts(shapes)) == sum(p.numel() for p in model.parameters())
    critic = Critic.from_policy(model)
    router = shapes.sparse_layers > 0  # a dense model has no router to freeze
    frozen = freeze_parameters(critic, critic_freeze_patterns("attention", router=router))
    n_frozen = sum(p.numel() for n, p in critic.named_parameters() if n in frozen)
    n_trained = sum(p.numel() for p in critic.parameters() if p.requires_grad)
    assert critic_params(param_counts(shapes), shapes, router=router) == (n_trained, n_frozen)


def test_state_bytes_are_what_adamw_holds_after_a_step():
    """params + grads + optimizer of trainer_memory at world size 1 = the bytes of the fp32 masters, their
    gradients and AdamW's state after one real step on the policy and the frozen-attention critic."""
    torch.manual_seed(0)
    policy = MODELS["qwen3_moe"]()
    critic = Critic.from_policy(policy)
    freeze_parameters(critic, critic_freeze_patterns("attention"))
    ids = torch.randint(0, 300, (1, 16))
    held = 0
    for module, loss in ((policy, lambda: policy(ids).logits.sum()), (critic, lambda: critic(ids).sum())):
        params = [p for p in module.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params)
        loss().backward()
        opt.step()
        tensors = list(module.parameters()) + [p.grad for p in params if p.grad is not None]
        tensors += [t for state in opt.state.values() for k, t in state.items() if k != "step"]
        held += sum(t.numel() * t.element_size() for t in tensors)
    shapes = Shapes.from_config(policy.config)
    m = trainer_memory(shapes, 1, 16, 2, True, 8, critic=critic_params(param_counts(shapes), shapes))
    assert m.params + m.grads + m.optimizer == held
    m4 = trainer_memory(shapes, 4, 16, 2, True, 8, critic=critic_params(param_counts(shapes), shapes))
    assert m4.params + m4.grads + m4.optimizer == pytest.approx(held / 4)
    offloaded = trainer_memory(shapes, 1, 16, 2, True, 8, offload=True, critic=critic_params(param_counts(shapes),
                                                                                            shapes))
    assert (offloaded.params, offloaded.grads, offloaded.optimizer, offloaded.host) == (0, 0, 0, held)


@pytest.fixture(scope="module")
def flagship(project_root):
    return project_root / "configs/swe-verified.yaml"


def test_the_flagship_plan_fits_8_x_80gb_for_the_trainer_and_separate_engine_gpus(flagship):
    cfg = load_config(flagship)
    p = plan(cfg)
    assert p.shapes_source in ("model.config", f"config.json of {cfg.model.path}")
    assert 30.4e9 < p.policy_params < 30.6e9  # Qwen3-30B-A3B
    assert (p.gpus_per_node, p.gpu_memory_bytes) == (8, 80 * GiB)
    assert p.trainer_ranks == 8 and set(p.trainer_nodes) == {0}
    assert (p.replicas, p.tensor_parallel, p.gpus_per_replica) == (2, 4, 4)
    assert not set(p.engine_nodes) & set(p.trainer_nodes)
    assert p.tokens >= 131072 and p.checkpointing
    assert p.trainer.total <= TRAINER_MEMORY_FRACTION * 80 * GiB
    assert p.engine_weights + p.engine_kv <= cfg.engine.gpu_memory_utilization * 80 * GiB
    assert p.engine_kv >= p.kv_per_token * p.context


def test_sao_config_prints_the_plan(flagship, capsys):
    assert main(["config", "--config", str(flagship)]) == 0
    out = capsys.readouterr().out
    for needle in ("# GPU plan: 2 node(s) x 8 GPUs of 80.0 GiB", "# trainer: 8 ranks (runtime.world_size)",
                   "# trainer per GPU:", "# engine: 2 replica(s)", "# engine per GPU: weights"):
        assert needle in out


@pytest.mark.parametrize("overrides, key", [
    (["cluster.nodes=1"], "engine.replicas"),  # trainer 8 + engine 2 x 4 GPUs on 8
    (["runtime.world_size=12"], "runtime.world_size"),  # 12 + 8 > 16
    (["engine.tensor_parallel_size=16"], "engine.gpus_per_replica"),  # a replica across nodes
    (["runtime.offload_optimizer=false"], "runtime.world_size"),  # ~170 GiB of state per GPU
    (["trainer.checkpoint_above_tokens=null"], "runtime.world_size"),  # 48 layers of 128k activations
    (["cluster.gpu_memory_bytes=42949672960"], "runtime.world_size"),  # 40 GiB cards
    (["cluster.host_memory_bytes=549755813888"], "cluster.host_memory_bytes"),  # 512 GiB hosts
    (["engine.gpu_memory_utilization=0.2"], "engine.tensor_parallel_size"),  # no room for one 128k sequence
])
def test_a_plan_that_does_not_fit_is_refused_naming_the_key(flagship, capsys, overrides, key):
    assert main(["config", "--config", str(flagship), *overrides]) == 2
    err = capsys.readouterr().err
    assert key in err and "\n" not in err.strip()


def test_shapes_come_from_config_json_and_model_config_must_agree(tmp_path):
    Qwen3Config(**SMALL).save_pretrained(tmp_path)
    base = ["cluster.nodes=1", "runtime.device=cuda", f"model.path={tmp_path}"]
    assert plan(load_config(None, base)).shapes_source == f"config.json of {tmp_path}"
    with pytest.raises(ConfigError, match=r"model.config.num_hidden_layers \(99\) differs"):
        load_config(None, [*base, "model.config={num_hidden_layers: 99}"])
    with pytest.raises(ConfigError, match="model.config: the GPU plan needs the shapes"):
        load_config(None, ["cluster.nodes=1", "runtime.device=cuda", f"model.path={tmp_path / 'absent'}"])
