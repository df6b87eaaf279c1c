"""The GPU plan of a run: which GPUs the trainer ranks and the engine replicas take, and the memory
each GPU needs (estimates), checked against the nodes the config describes (``cluster.*``).

Shapes (``model_shapes``): the config.json of ``model.path`` (read offline), else ``model.config``
(config.json's fields written into the run config, for a model that is not on this machine).

Parameters of a Qwen3 / Qwen3-MoE / Llama decoder (``param_counts``), from the shapes:
    attention = H (n_h d) + 2 H (n_kv d) + (n_h d) H  [+ n_h d + 2 n_kv d + H biases]  [+ 2 d q/k norms]
    mlp       = 3 H I                                   a dense layer (gate, up, down)
    moe       = E H (router) + 3 E H I_e                a sparse layer (E experts)
    layer     = attention + (mlp | moe) + 2 H (its two RMS norms)
    policy    = V H (embeddings) + sum of layers + H (final norm) + V H (LM head, unless tied)
    critic    = policy - LM head + H + 1 (value head); critic_freeze=attention freezes attention [+ norms,
                router, embeddings]
Trainer, per GPU (FSDP2 over W = runtime.world_size ranks, mixed precision: compute in the model dtype
of b bytes, fp32 master weights, fp32 gradient reduction):
    params     = 4 (P_trained + P_frozen) / W              fp32 master shards (policy + critic)
    grads      = 4 P_trained / W                           fp32 gradient shards
    optimizer  = 8 P_trained / W                           AdamW: exp_avg + exp_avg_sq, fp32
                 runtime.offload_optimizer (FSDP2 CPUOffloadPolicy): these three live in host memory
    gathered   = 2 b (root + 2 layer)                      unsharded weights + their gradients in dtype b: the
                 root (embeddings, final norm, head: held for the whole pass) and two decoder layers (one
                 computing, one prefetched)
    activations, T = tokens per micro-batch (max of the micro-batch budget and the context budget: a
                 trajectory is never split), the larger of the policy and the critic pass:
        one layer  = 2 T b (2 n_h d + 2 n_kv d + 2 H  +  3 I + H  |  k (3 I_e + H) + 4 E / b)
                     (attention in/out and q, k, v, o; MLP or the k routed experts and fp32 router
                     logits; x 2: their gradients; flash / memory-efficient attention: O(T), not O(T^2))
        checkpointed: L T H b (each layer's input) + one layer (recomputed in backward)
        not:          L x one layer
        + logits   = 8 C V + 8 T H                         two fp32 [chunk C, vocab] buffers of the chunked
                                                           logprobs, fp32 hidden states and their gradient
    params + grads + optimizer + gathered + activations <= TRAINER_MEMORY_FRACTION x cluster.gpu_memory_bytes
Engine, per GPU (vLLM, tensor parallel t = engine.tensor_parallel_size):
    weights    = P b / t
    KV / token = 2 L max(1, n_kv / t) d b_kv               K and V of every layer (b_kv: 1 for an fp8 cache)
    KV cache   = engine.kv_cache_bytes, else gpu_memory_utilization x cluster.gpu_memory_bytes - weights;
                 it must hold one sequence of the context length (vLLM refuses to start otherwise)
Placement: trainer ranks fill nodes in order; each engine replica takes engine.gpus_per_replica
(null: t) free GPUs of one node, first fit. A plan that does not fit is a ValueError naming the key.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from sao_harness.harness.engines.registry import engine_spec, replica_gpus

GiB = 2 ** 30
TRAINER_MEMORY_FRACTION = 0.9  # the rest: CUDA context, NCCL buffers, allocator fragmentation
FAMILIES = ("qwen3", "qwen3_moe", "llama")  # the decoders whose parameters param_counts knows


# --- shapes and parameter counts ----------------------------------------------------------------

@dataclass(frozen=True)
class Shapes:
    """The fields of a decoder's config.json the plan reads."""

    model_type: str
    vocab: int  # V
    hidden: int  # H
    layers: int  # L
    heads: int  # n_h
    kv_heads: int  # n_kv
    head_dim: int  # d
    intermediate: int  # I, a dense layer's MLP width
    experts: int = 0  # E (0: dense)
    experts_per_token: int = 0  # k
    expert_intermediate: int = 0  # I_e
    sparse_layers: int = 0  # layers with a MoE block
    tied: bool = False  # the LM head is the embedding matrix
    attention_bias: bool = False

    @classmethod
    def from_config(cls, config) -> Shapes:
        """From a transformers PretrainedConfig (its text config)."""
        c = config.get_text_config()
        if c.model_type not in FAMILIES:
            raise ValueError(f"model_type {c.model_type!r}: the GPU plan counts the parameters of {FAMILIES}")
        experts = getattr(c, "num_experts", 0) or 0
        sparse = 0
        if c.model_type == "qwen3_moe" and experts:  # transformers' Qwen3MoeDecoderLayer rule
            sparse = sum(i not in (c.mlp_only_layers or []) and (i + 1) % c.decoder_sparse_step == 0
                         for i in range(c.num_hidden_layers))
        return cls(model_type=c.model_type, vocab=c.vocab_size, hidden=c.hidden_size, layers=c.num_hidden_layers,
                   heads=c.num_attention_heads, kv_heads=c.num_key_value_heads,
                   head_dim=getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
                   intermediate=c.intermediate_size, experts=experts if sparse else 0,
                   experts_per_token=getattr(c, "num_experts_per_tok", 0) if sparse else 0,
                   expert_intermediate=getattr(c, "moe_intermediate_size", 0) if sparse else 0,
                   sparse_layers=sparse, tied=bool(c.tie_word_embeddings),
                   attention_bias=bool(getattr(c, "attention_bias", False)))


def param_counts(s: Shapes) -> dict[str, int]:
    """Parameters of the causal LM by kind (the module doc's equations), summed over layers;
    ``layer`` is the largest decoder layer."""
    h, qd, kvd = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim
    attention = 2 * h * qd + 2 * h * kvd
    attention += (qd + 2 * kvd + h) * s.attention_bias + 2 * s.head_dim * (s.model_type != "llama")
    moe_mlp, router = 3 * s.experts * h * s.expert_intermediate, s.experts * h
    dense = s.layers - s.sparse_layers
    counts = {
        "embed_tokens": s.vocab * h,
        "self_attn": s.layers * attention,
        "layer_norms": s.layers * 2 * h,
        "router": s.sparse_layers * router,
        "mlp": s.sparse_layers * moe_mlp + dense * 3 * h * s.intermediate,
        "norm": h,
        "lm_head": 0 if s.tied else s.vocab * h,
    }
    largest_mlp = max(moe_mlp + router if s.sparse_layers else 0, 3 * h * s.intermediate if dense else 0)
    return counts | {"layer": attention + 2 * h + largest_mlp}


def total_params(counts: dict[str, int]) -> int:
    return sum(v for k, v in counts.items() if k != "layer")


def critic_params(counts: dict[str, int], s: Shapes, freeze: str = "attention", norms: bool = True,
                  router: bool = True, embeddings: bool = True) -> tuple[int, int]:
    """(trained, frozen) parameters of the critic (trainer.modeling.models.Critic with critic_freeze_patterns)."""
    total = total_params(counts) - counts["lm_head"] + s.hidden + 1
    frozen = 0
    if freeze == "attention":
        frozen = (counts["self_attn"] + (counts["layer_norms"] + counts["norm"]) * norms
                  + counts["router"] * router + counts["embed_tokens"] * embeddings)
    return total - frozen, frozen


# --- memory -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TrainerMemory:
    """Bytes per trainer GPU (``params``..``activations``) and per rank in host memory (``host``)."""

    params: float
    grads: float
    optimizer: float
    gathered: float
    activations: float
    host: float = 0.0

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.gathered + self.activations


def layer_activations(s: Shapes, tokens: int, b: int) -> float:
    """Bytes one decoder layer's forward leaves for its backward at `tokens` tokens, x 2 (gradients)."""
    attention = 2 * s.heads * s.head_dim + 2 * s.kv_heads * s.head_dim + 2 * s.hidden
    if s.sparse_layers:
        mlp = s.experts_per_token * (3 * s.expert_intermediate + s.hidden) + 4 * s.experts / b
    else:
        mlp = 3 * s.intermediate + s.hidden
    return 2 * tokens * b * (attention + mlp)


def trainer_memory(s: Shapes, world_size: int, tokens: int, dtype_bytes: int, checkpointing: bool,
                   logprob_chunk: int, offload: bool = False, critic: tuple[int, int] | None = None) -> TrainerMemory:
    """Per-GPU bytes of the policy and (``critic`` = its (trained, frozen) counts) the critic, both
    trained on the same ranks (the module doc's equations)."""
    counts, b = param_counts(s), dtype_bytes
    trained, frozen = total_params(counts), 0
    if critic is not None:
        trained, frozen = trained + critic[0], critic[1]
    params, grads, optimizer = 4 * (trained + frozen) / world_size, 4 * trained / world_size, 8 * trained / world_size
    root = counts["embed_tokens"] + counts["norm"] + max(counts["lm_head"], s.hidden + 1)
    gathered = 2 * b * (root + 2 * counts["layer"])
    layer = layer_activations(s, tokens, b)
    body = s.layers * tokens * s.hidden * b + layer if checkpointing else s.layers * layer
    activations = body + 8 * min(logprob_chunk, tokens) * s.vocab + 8 * tokens * s.hidden
    host = 0.0
    if offload:
        host, params, grads, optimizer = params + grads + optimizer, 0.0, 0.0, 0.0
    return TrainerMemory(params, grads, optimizer, gathered, activations, host)


def kv_bytes_per_token(s: Shapes, tensor_parallel: int, kv_dtype_bytes: int) -> float:
    """KV cache bytes of one token on one engine GPU: 2 L max(1, n_kv / t) d b_kv."""
    return 2 * s.layers * max(1.0, s.kv_heads / tensor_parallel) * s.head_dim * kv_dtype_bytes


# --- the plan of a run config -------------------------------------------------------------------

@dataclass
class GPUPlan:
    """What ``plan(cfg)`` found; ``describe()`` is what ``sao config`` prints."""

    nodes: int
    gpus_per_node: int
    gpu_memory_bytes: int
    shapes_source: str
    policy_params: int
    critic_trained: int
    critic_frozen: int
    trainer_ranks: int  # 0: the trainer is not on GPUs
    trainer_nodes: list[int]
    tokens: int
    checkpointing: bool
    offload: bool
    trainer: TrainerMemory | None
    replicas: int
    gpus_per_replica: int  # 0: the engine is not on GPUs
    tensor_parallel: int
    engine_nodes: list[int]
    engine_weights: float = 0.0
    engine_kv: float = 0.0
    kv_per_token: float = 0.0
    context: int = 0
    episodes_per_replica: float = 0.0

    def describe(self) -> list[str]:
        g = lambda x: f"{x / GiB:.1f} GiB"
        out = [f"GPU plan: {self.nodes} node(s) x {self.gpus_per_node} GPUs of {g(self.gpu_memory_bytes)} "
               f"(cluster.*); model {self.policy_params / 1e9:.2f} B parameters ({self.shapes_source}), critic "
               f"{self.critic_trained / 1e9:.2f} B trained + {self.critic_frozen / 1e9:.2f} B frozen"]
        if self.trainer_ranks and self.trainer is not None:
            m = self.trainer
            out.append(f"trainer: {self.trainer_ranks} ranks (runtime.world_size) on node(s) "
                       f"{_nodes(self.trainer_nodes)}; {self.tokens} tokens per micro-batch, activation "
                       f"checkpointing {'on' if self.checkpointing else 'off'}, optimizer offload "
                       f"{'on' if self.offload else 'off'}")
            host = (f"; host memory {g(m.host)} per rank, {g(m.host * self._ranks_per_node())} per node"
                    if m.host else "")
            out.append(f"trainer per GPU: {g(m.total)} of {g(TRAINER_MEMORY_FRACTION * self.gpu_memory_bytes)} "
                       f"= params {g(m.params)} + grads {g(m.grads)} + optimizer {g(m.optimizer)} + gathered "
                       f"{g(m.gathered)} + activations {g(m.activations)}{host}")
        else:
            out.append("trainer: not on GPUs (runtime.device)")
        if self.gpus_per_replica:
            sequences = self.engine_kv / max(self.kv_per_token * self.context, 1.0)
            out.append(f"engine: {self.replicas} replica(s) (engine.replicas) x {self.gpus_per_replica} GPUs, "
                       f"tensor parallel {self.tensor_parallel}, on node(s) {_nodes(self.engine_nodes)}")
            out.append(f"engine per GPU: weights {g(self.engine_weights)} + KV cache {g(self.engine_kv)} = "
                       f"{sequences:.1f} sequences of {self.context} tokens per replica, for "
                       f"{self.episodes_per_replica:.0f} episodes each (rollout.workers / engine.replicas)")
        else:
            out.append("engine: not on GPUs")
        return out

    def _ranks_per_node(self) -> int:
        return max(self.trainer_nodes.count(n) for n in set(self.trainer_nodes)) if self.trainer_nodes else 0


def _nodes(nodes: list[int]) -> str:
    return ", ".join(str(n) for n in sorted(set(nodes)))


def model_shapes(model_cfg) -> tuple[Shapes, str]:
    """(Shapes, where they came from) of ``model.path``: its config.json (read offline), else
    ``model.config``; both present and different on a field is an error naming it."""
    from transformers import AutoConfig  # lazy: transformers is heavy

    from sao_harness.harness.tiny_model import MODEL_SHAPE, VOCAB_SIZE  # lazy: only the tiny model's recipe

    given = dict(getattr(model_cfg, "config", None) or {})
    if model_cfg.path == "tiny":  # the recipe's shapes, without building the model
        return Shapes.from_config(AutoConfig.for_model("qwen3_moe", vocab_size=VOCAB_SIZE, **MODEL_SHAPE)), "tiny"
    try:
        local = AutoConfig.from_pretrained(model_cfg.path, local_files_only=True)
    except Exception as e:  # noqa: BLE001  (any reason it is unreadable: model.config, or say why)
        if not given:
            raise ValueError(f"model.config: the GPU plan needs the shapes of model.path {model_cfg.path!r}, whose "
                             f"config.json is not on this machine ({type(e).__name__}); copy its config.json "
                             "fields (model_type, vocab_size, hidden_size, num_hidden_layers, ...) under "
                             "model.config") from None
        if "model_type" not in given:
            raise ValueError("model.config: needs model_type (e.g. qwen3_moe), as in config.json") from None
        config = AutoConfig.for_model(**given)
        return Shapes.from_config(config), "model.config"
    text = local.get_text_config()
    for key, value in given.items():
        if key != "model_type" and getattr(text, key, value) != value:
            raise ValueError(f"model.config.{key} ({value!r}) differs from the config.json of {model_cfg.path} "
                             f"({getattr(text, key)!r})")
    return Shapes.from_config(local), f"config.json of {model_cfg.path}"


def _place(free: list[int], demand: list[int]) -> list[int] | None:
    """First fit: the node index of each demand (GPUs on one node), or None if one does not fit."""
    out = []
    for need in demand:
        node = next((i for i, f in enumerate(free) if f >= need), None)
        if node is None:
            return None
        free[node] -= need
        out.append(node)
    return out


def plan(cfg) -> GPUPlan | None:
    """The GPU plan of a run config (None where ``cluster.nodes`` is 0: no nodes described); a plan
    that does not fit its nodes is a ValueError naming the key to change."""
    from sao_harness.harness.config import context_budget  # lazy: reads the model's config

    c = cfg.cluster
    if not c.nodes:
        return None
    shapes, source = model_shapes(cfg.model)
    counts = param_counts(shapes)
    t, rt, e = cfg.trainer, cfg.runtime, cfg.engine
    b = {"float32": 4, "bfloat16": 2, "float16": 2}[cfg.model.dtype]
    critic = (critic_params(counts, shapes, t.critic_freeze, t.critic_freeze_norms, t.critic_freeze_router,
                            t.critic_freeze_embeddings) if t.advantage == "gae" else (0, 0))
    context = context_budget(cfg).tokens
    tokens = max(t.max_tokens_per_microbatch, context)  # a longer trajectory is a micro-batch of its own
    above, offload = t.checkpoint_above_tokens, rt.offload_optimizer
    checkpointing = t.gradient_checkpointing or (above is not None and tokens > above)
    ranks = rt.world_size if rt.device.startswith("cuda") else 0
    per_replica = math.ceil(replica_gpus(e))
    tp = getattr(e, "tensor_parallel_size", 1)  # a key of the vllm kind (engine.* keys are the kind's)
    free = [c.gpus_per_node] * c.nodes
    available = c.nodes * c.gpus_per_node
    need = f"{ranks} trainer GPUs (runtime.world_size) + {e.replicas} x {per_replica} engine GPUs (engine.replicas)"
    trainer_nodes = []
    for _ in range(ranks):  # ranks fill nodes in order
        node = next((i for i, f in enumerate(free) if f), None)
        if node is None:
            raise ValueError(f"runtime.world_size: {need} do not fit cluster.nodes x cluster.gpus_per_node = "
                             f"{c.nodes} x {c.gpus_per_node} = {available} GPUs")
        free[node] -= 1
        trainer_nodes.append(node)
    if per_replica > c.gpus_per_node:
        raise ValueError(f"engine.gpus_per_replica: a replica's {per_replica} GPUs (tensor parallel "
                         f"{tp}) must share one node of cluster.gpus_per_node = {c.gpus_per_node}")
    engine_nodes = _place(free, [per_replica] * e.replicas) if per_replica else []
    if engine_nodes is None:
        raise ValueError(f"engine.replicas: {need} do not fit cluster.nodes x cluster.gpus_per_node = {c.nodes} x "
                         f"{c.gpus_per_node} = {available} GPUs (each replica on one node)")
    p = GPUPlan(nodes=c.nodes, gpus_per_node=c.gpus_per_node, gpu_memory_bytes=c.gpu_memory_bytes,
                shapes_source=source, policy_params=total_params(counts), critic_trained=critic[0],
                critic_frozen=critic[1], trainer_ranks=ranks, trainer_nodes=trainer_nodes, tokens=tokens,
                checkpointing=checkpointing, offload=offload, trainer=None, replicas=e.replicas,
                gpus_per_replica=per_replica, tensor_parallel=tp, engine_nodes=engine_nodes,
                context=context, episodes_per_replica=cfg.rollout.workers / e.replicas)
    if ranks:
        m = trainer_memory(shapes, ranks, tokens, b, checkpointing, t.logprob_chunk, offload,
                           critic if t.advantage == "gae" else None)
        p.trainer = m
        limit = TRAINER_MEMORY_FRACTION * c.gpu_memory_bytes
        if m.total > limit:
            raise ValueError(f"runtime.world_size: the trainer needs an estimated {m.total / GiB:.1f} GiB per GPU "
                             f"(params {m.params / GiB:.1f} + grads {m.grads / GiB:.1f} + optimizer "
                             f"{m.optimizer / GiB:.1f} + gathered {m.gathered / GiB:.1f} + activations "
                             f"{m.activations / GiB:.1f} at {tokens} tokens, checkpointing "
                             f"{'on' if checkpointing else 'off'}) > {TRAINER_MEMORY_FRACTION} x "
                             f"cluster.gpu_memory_bytes = {limit / GiB:.1f} GiB: more ranks, optimizer offload, or "
                             "activation checkpointing")
        host_per_node = m.host * p._ranks_per_node()
        if c.host_memory_bytes is not None and host_per_node > c.host_memory_bytes:
            raise ValueError(f"cluster.host_memory_bytes: the offloaded optimizer needs {host_per_node / GiB:.1f} GiB "
                             f"of host memory per node > {c.host_memory_bytes / GiB:.1f} GiB")
    if per_replica and engine_spec(e.kind).gpu_kv_cache:
        kv_b = 1 if str(getattr(e, "vllm_args", {}).get("kv_cache_dtype", "auto")).startswith("fp8") else b
        p.engine_weights = p.policy_params * b / tp
        p.kv_per_token = kv_bytes_per_token(shapes, tp, kv_b)
        p.engine_kv = (e.kv_cache_bytes if getattr(e, "kv_cache_bytes", None) is not None
                       else e.gpu_memory_utilization * c.gpu_memory_bytes - p.engine_weights)
        if p.engine_kv < p.kv_per_token * context:
            raise ValueError(f"engine.tensor_parallel_size: weights {p.engine_weights / GiB:.1f} GiB per GPU leave a "
                             f"KV cache of {p.engine_kv / GiB:.1f} GiB, less than one sequence of {context} tokens "
                             f"({p.kv_per_token * context / GiB:.1f} GiB) within engine.gpu_memory_utilization x "
                             "cluster.gpu_memory_bytes")
    return p
