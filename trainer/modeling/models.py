"""Policy logprobs in chunks, the critic, and parameter freezing (docs/algorithm.md sections 4, 8).

Token alignment: the logprob and the value of token t are read at position t-1, the position that
predicts it. Both come back as [B, T] tensors aligned with input_ids; position 0 has no predictor,
so an action token at position 0 is rejected.

Rows: padded ([B, T] with attention_mask) or packed (trainer.algo.batch.PackedRows: [1, L] with
position_ids restarting at 0 per trajectory and no mask; transformers then keeps attention inside
each trajectory). In a packed row the token before a trajectory's first token is the previous
trajectory's last: the first token of each trajectory (position id 0) has no predictor either.

Sampling distribution (must equal the engine's, or r_t != 1 even on-policy): the rule of
harness.engines.sampling, which is the order of transformers' generate and of vLLM:
    z = logits / temperature
    top-k (k > 0):  drop tokens whose z is below the k-th largest z (ties with it are kept)
    top-p (p < 1):  on softmax(z) of what is left, sort ascending and drop the tokens whose
                    cumulative probability is <= 1 - p (the most probable token is always kept)
    logp(x) = z_x - logsumexp(z over kept tokens) for a kept x, and -inf for a dropped x
The kept set is a discrete choice and gets no gradient; gradients flow through z of kept tokens.
Entropy is the entropy of that same (filtered, renormalised) distribution.

Memory: [T, vocab] logits are never built for the whole sequence. `chunked_token_logprobs` is a
custom autograd.Function that runs `chunk_size` positions at a time and recomputes each chunk's
logits in backward; it saves only O(T) numbers, so peak extra memory is O(chunk_size * vocab), not
O(T * vocab), and the [chunk, vocab] work is done in place.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import re
from pathlib import Path

import torch
from safetensors.torch import load_model, save_model
from torch import nn

from sao_harness.harness.engines.sampling import filter_logits_

CRITIC_WEIGHTS = "critic.safetensors"


# --- logprobs of the sampling distribution ------------------------------------------------------

def _check_sampling(temperature: float, top_k: int, top_p: float) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {top_k!r}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (1 = off), got {top_p}")


def sampling_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0,
                    top_p: float = 1.0) -> torch.Tensor:
    """logits [N, V] -> z [N, V]: divided by temperature, -inf at the tokens top-k / top-p drop.

    The engine's rule (``harness.engines.sampling``), in place on ``logits`` (pass a fresh fp32
    tensor); no gradient flows through it.
    """
    return filter_logits_(logits, temperature, top_p, top_k)


def _chunk_logits(hidden, weight, bias, out, sampling):
    """z = filter((h W^T + b) / tau) for one chunk, written into the reusable buffer `out`."""
    z = torch.matmul(hidden, weight.T, out=out[:hidden.shape[0]])
    if bias is not None:
        z.add_(bias)
    return sampling_logits(z, *sampling)


class _ChunkedLogprobs(torch.autograd.Function):
    """(logp, entropy) of the sampling distribution, one chunk of positions at a time.

    Forward, per chunk: z = filter((h W^T + b) / tau), lse = logsumexp(z), log q = z - lse,
        logp = log q[y],  H = -sum_v q_v log q_v.   Saved: h, W, b, y, lse and H (O(N), not O(N V)).
    Backward, per chunk, z recomputed:
        dlogp/dz = onehot(y) - q,   dH/dz = -q * (log q + H)
        g_z = g_logp * onehot(y) - q * (g_logp + g_H * (log q + H)),   then through z = (h W^T + b) / tau:
        g_h = g_z W / tau,   g_W = g_z^T h / tau,   g_b = sum g_z / tau.
    A dropped target (logp = -inf, a constant) gets no gradient. The kept set gets none either.
    Two [chunk, V] buffers are allocated once per call and reused by every chunk, in place.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, top_k, top_p, chunk_size):
        n, sampling = hidden.shape[0], (temperature, top_k, top_p)
        logp, entropy, lse = hidden.new_empty(n), hidden.new_empty(n), hidden.new_empty(n)
        z_buf = hidden.new_empty(min(chunk_size, n), weight.shape[0])
        q_buf = torch.empty_like(z_buf)
        for start in range(0, n, chunk_size):
            end = min(start + chunk_size, n)
            z = _chunk_logits(hidden[start:end], weight, bias, z_buf, sampling)
            top = z.amax(dim=-1, keepdim=True)
            q = torch.exp(z.sub_(top), out=q_buf[:end - start])  # unnormalised, in (0, 1]
            total = q.sum(dim=-1, keepdim=True)
            logq = z.sub_(total.log())  # z - lse
            q.div_(total)
            lse[start:end] = (top + total.log()).squeeze(-1)
            logp[start:end] = logq.gather(-1, targets[start:end, None]).squeeze(-1)
            if top_k > 0 or top_p < 1.0:
                logq.nan_to_num_(neginf=0.0)  # dropped tokens have q = 0; avoid 0 * -inf
            entropy[start:end] = -torch.bmm(q[:, None, :], logq[:, :, None]).view(-1)  # -sum q log q
        ctx.save_for_backward(hidden, weight, bias, targets, lse, entropy)
        ctx.sampling, ctx.chunk_size = sampling, chunk_size
        ctx.mark_non_differentiable(lse)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, bias, targets, lse, entropy = ctx.saved_tensors
        temperature, top_k, top_p = ctx.sampling
        n = hidden.shape[0]
        grad_logp = torch.zeros_like(lse) if grad_logp is None else grad_logp
        grad_entropy = torch.zeros_like(lse) if grad_entropy is None else grad_entropy
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_hidden = torch.zeros_like(hidden) if need_h else None
        grad_weight = torch.zeros_like(weight) if need_w else None
        grad_bias = torch.zeros_like(bias) if need_b else None
        z_buf = hidden.new_empty(min(ctx.chunk_size, n), weight.shape[0])
        q_buf = torch.empty_like(z_buf)
        for start in range(0, n, ctx.chunk_size):
            end = min(start + ctx.chunk_size, n)
            h, y = hidden[start:end], targets[start:end, None]
            logq = _chunk_logits(h, weight, bias, z_buf, ctx.sampling).sub_(lse[start:end, None])
            g_logp = torch.where(torch.isfinite(logq.gather(-1, y)).squeeze(-1), grad_logp[start:end], 0.0)
            q = torch.exp(logq, out=q_buf[:end - start])
            if top_k > 0 or top_p < 1.0:
                logq.nan_to_num_(neginf=0.0)  # dropped tokens have q = 0
            # g_z = -q * (g_logp + g_H * (log q + H)) + g_logp * onehot(y), in place over logq
            g_z = logq.add_(entropy[start:end, None]).mul_(-grad_entropy[start:end, None])
            g_z.sub_(g_logp[:, None]).mul_(q)
            g_z.scatter_add_(-1, y, g_logp[:, None])
            if temperature != 1.0:
                g_z.div_(temperature)
            if need_h:
                grad_hidden[start:end] = g_z @ weight
            if need_w:
                grad_weight.addmm_(g_z.T, h)
            if need_b:
                grad_bias += g_z.sum(0)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None


def chunked_token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                           bias: torch.Tensor | None = None, temperature: float = 1.0, top_k: int = 0,
                           top_p: float = 1.0, chunk_size: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(targets) and entropy of the sampling distribution, `chunk_size` positions at a time.

    hidden [N, H] (the states that predict targets [N]), weight [V, H] (and bias [V]) of the LM head.
    Returns (logp [N], entropy [N]) in fp32, differentiable w.r.t. hidden, weight and bias. Forward
    and backward each hold the logits of one chunk at a time (backward recomputes them).
    """
    _check_sampling(temperature, top_k, top_p)
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be > 0, got {chunk_size}")
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(f"hidden must be [N, H] and targets [N], got {tuple(hidden.shape)} and {tuple(targets.shape)}")
    # logits in fp32: a bf16 logit is too coarse for a logprob ratio (the casts are differentiable)
    # autocast off: under the trainer's bf16 autocast the matmuls would otherwise run in bf16
    with torch.autocast(device_type=hidden.device.type, enabled=False):
        weight = weight.float()
        bias = None if bias is None else bias.float()
        return _ChunkedLogprobs.apply(hidden.float(), weight, bias, targets, float(temperature), top_k, top_p,
                                      chunk_size)


def hidden_states(backbone, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                  position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """The base model's last hidden states [B, T, H] of padded rows (attention_mask [B, T], or None
    for rows without padding) or of packed rows (position_ids [1, L], restarting at 0 per trajectory,
    and no mask: transformers builds the block-diagonal causal mask, or runs flash-attention varlen,
    from the position ids; no KV cache, whose presence would turn that detection off)."""
    if position_ids is None:
        mask = None if attention_mask is None else attention_mask.long()
        return backbone(input_ids=input_ids, attention_mask=mask, use_cache=False).last_hidden_state
    if attention_mask is not None:
        raise ValueError("attention_mask: packed rows (position_ids given) take none; the position ids keep "
                         "attention inside each trajectory")
    if position_ids.shape != input_ids.shape:
        raise ValueError(f"position_ids {tuple(position_ids.shape)} must match input_ids {tuple(input_ids.shape)}")
    return backbone(input_ids=input_ids, position_ids=position_ids, use_cache=False).last_hidden_state


PACKED_SDPA = "sdpa_packed"  # transformers' SDPA attention, per trajectory on packed rows (use_packed_attention)


def _window_mask(queries: range, keys: range, window: int, device: torch.device) -> torch.Tensor:
    """[len(queries), len(keys)] bool, True = attend: query i sees key j iff i - window < j <= i (causal, and
    at most `window` keys back counting itself: transformers' sliding_window_overlay on its causal mask)."""
    back = torch.arange(queries.start, queries.stop, device=device)[:, None] \
        - torch.arange(keys.start, keys.stop, device=device)[None, :]  # i - j
    return (back >= 0) & (back < window)


def _causal_sdpa(query, key, value, window: int | None, dropout: float, scaling, block: int = 1024):
    """Causal SDPA of [B, heads, n, d] rows, queries = keys, with a sliding window of `window` keys (None: full).

    A window shorter than the row: queries in blocks of max(window, block), each over the keys its window
    reaches (the block's own and the window - 1 before it), so no [n, n] mask or score matrix is built.
    """
    n, gqa = query.shape[2], query.shape[1] != key.shape[1]
    if window is None or n <= window:  # the window hides nothing: the fused causal kernel
        return torch.nn.functional.scaled_dot_product_attention(query, key, value, dropout_p=dropout, scale=scaling,
                                                                is_causal=True, enable_gqa=gqa)
    if gqa:  # with a mask, repeat the kv heads (as transformers does): GQA + mask falls back to math on CUDA
        from transformers.integrations.sdpa_attention import repeat_kv  # lazy: heavy

        key, value = (repeat_kv(t, query.shape[1] // key.shape[1]) for t in (key, value))
    block, out = max(window, block), []
    for start in range(0, n, block):
        queries = range(start, min(start + block, n))
        keys = range(max(0, start - window + 1), queries.stop)
        mask = _window_mask(queries, keys, window, query.device)
        out.append(torch.nn.functional.scaled_dot_product_attention(
            query[:, :, queries.start:queries.stop], key[:, :, keys.start:keys.stop],
            value[:, :, keys.start:keys.stop], attn_mask=mask, dropout_p=dropout, scale=scaling))
    return torch.cat(out, dim=2)


def _packed_sdpa_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' SDPA attention, except on a packed row (one row, no mask, position ids restarting
    at 0): there causal SDPA runs on each trajectory's slice alone. Same result as the block-diagonal
    [L, L] mask, without building it or computing the L^2 - sum n_i^2 scores it discards.

    Sliding-window layers: transformers passes `sliding_window` (None on full-attention layers, e.g. the
    first max_window_layers of a Qwen model; flash_attention_2 reads the same argument). The mask
    function below returns no mask, so without a padding mask the window is applied here, per
    trajectory (or over the whole row): a query sees itself and the window - 1 keys before it, as in
    transformers' own sliding-window mask. With a padding mask, that mask (transformers') holds it.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward  # lazy: heavy

    window = kwargs.get("sliding_window")
    n, position_ids = query.shape[2], kwargs.get("position_ids")
    starts = [] if position_ids is None or attention_mask is not None or query.shape[0] != 1 \
        or key.shape[2] != n else (position_ids[0] == 0).nonzero().flatten().tolist()
    if len(starts) < 2 or starts[0] != 0:  # not packed: one sequence (causal) or a padded batch (its mask)
        if attention_mask is not None or window is None or key.shape[2] <= window:
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                          scaling=scaling, **kwargs)
        if key.shape[2] != n:
            raise ValueError(f"sliding_window={window}: {PACKED_SDPA} got {n} queries over {key.shape[2]} keys "
                             "(a KV cache) and no attention_mask to hold the window; pass attention_mask, or use "
                             "attn_implementation='sdpa'")
        starts = [0]  # unpadded rows: the whole row is one sequence
    out = [_causal_sdpa(query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], window, dropout, scaling)
           for s, e in zip(starts, starts[1:] + [n])]
    return torch.cat(out, dim=2).transpose(1, 2).contiguous(), None


def _packed_sdpa_mask(*args, attention_mask=None, **kwargs):
    """No mask without a padding mask (the attention above is causal per trajectory, and windowed on a
    sliding-window layer); else SDPA's (transformers' window included)."""
    from transformers.masking_utils import sdpa_mask  # lazy: heavy

    return None if attention_mask is None else sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


PACKED_FLEX = "flex_packed"  # FlexAttention under a document BlockMask on packed rows (use_packed_attention)
_BLOCK_MASKS: dict = {}  # sliding window (None: full) -> (position_ids, its _version, its BlockMask)


def document_block_mask(position_ids: torch.Tensor, window: int | None):
    """The FlexAttention BlockMask of one packed row, position_ids [1, L] restarting at 0 per trajectory:
        doc = cumsum(position_ids == 0),  attend(q, kv) = doc[q] == doc[kv]  and  0 <= q - kv < window
    (window = L on a full-attention layer). One mask function for every layer, the window a tensor: one
    compiled kernel serves all layers and lengths (torch.compile guards on the function's code)."""
    from torch.nn.attention.flex_attention import create_block_mask  # lazy: only the flex path needs it

    doc, n = (position_ids[0] == 0).cumsum(0), position_ids.shape[1]
    reach = torch.tensor(n if window is None else window, device=position_ids.device)

    def document_causal(b, h, q, kv):
        return (doc[q] == doc[kv]) & (q >= kv) & (q - kv < reach)

    with torch.no_grad():
        return create_block_mask(document_causal, 1, None, n, n, device=position_ids.device, _compile=True)


def _cached_block_mask(position_ids: torch.Tensor, window: int | None):
    """document_block_mask, built once for the layers of a forward: they get the same position_ids tensor."""
    cached = _BLOCK_MASKS.get(window)
    if cached is None or cached[0] is not position_ids or cached[1] != position_ids._version:
        cached = _BLOCK_MASKS[window] = (position_ids, position_ids._version,
                                         document_block_mask(position_ids, window))
    return cached[2]


@functools.cache
def _flex_kernel(device_type: str):
    """flex_attention torch.compile'd: the fused kernel (eager flex_attention is a dense [L, L] reference).
    Shapes go dynamic at the second length (torch's default). On CPU the eager reference: torch 2.13's CPU
    kernel fails to build with dynamic shapes, and has no backward anyway (resolve_attn_impl)."""
    from torch.nn.attention.flex_attention import flex_attention  # lazy: only the flex path needs it

    return flex_attention if device_type == "cpu" else torch.compile(flex_attention)


def _packed_flex_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """On a packed row (one row, no mask, position ids; queries = keys): FlexAttention of query/key/value
    [1, heads, L, d] (GQA: fewer kv heads) under document_block_mask with the layer's sliding_window: on
    CUDA one fused kernel for the whole row that skips the blocks outside every trajectory, no host sync
    (CPU: torch's eager reference, forward only, _flex_kernel). Anything
    else (padded rows, rows without position ids, a KV cache) runs as on sdpa_packed. Under autocast the
    inputs are cast to the autocast dtype, as SDPA's are. No attention dropout (FlexAttention has none)."""
    position_ids = kwargs.get("position_ids")
    if position_ids is None or attention_mask is not None or query.shape[0] != 1 \
            or key.shape[2] != query.shape[2] or position_ids.shape != (1, query.shape[2]):
        return _packed_sdpa_attention(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    if dropout:
        raise ValueError(f"attention dropout {dropout}: FlexAttention ({PACKED_FLEX}) has none; set the model's "
                         "attention_dropout to 0 or use trainer.attn_impl=sdpa_packed")
    if query.device.type == "cpu" and torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)):
        raise NotImplementedError(f"trainer.attn_impl=flex: FlexAttention has no backward on CPU (torch "
                                  f"{torch.__version__}); use sdpa_packed (what auto picks on CPU)")
    device = query.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else query.dtype
    query, key, value = (t.to(dtype) for t in (query, key, value))
    block_mask = _cached_block_mask(position_ids, kwargs.get("sliding_window"))
    out = _flex_kernel(device)(query, key, value, block_mask=block_mask, scale=scaling,
                               enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


ATTN_IMPLS = ("auto", "sdpa_packed", "flex", "flash_varlen")  # trainer.attn_impl
_REGISTERED = {"sdpa_packed": PACKED_SDPA, "flex": PACKED_FLEX, "flash_varlen": "flash_attention_2"}


def _flash_attn_importable() -> bool:
    import importlib.util  # lazy: asked once, when attn_impl is resolved

    return importlib.util.find_spec("flash_attn") is not None


def resolve_attn_impl(impl: str, device: torch.device | str) -> str:
    """trainer.attn_impl -> the implementation run on `device` (the model's):
        auto -> flash_varlen   on CUDA with the flash_attn package (its varlen kernel, from the position ids)
                flex           on CUDA without it (FlexAttention, document BlockMask)
                sdpa_packed    on CPU: torch's FlexAttention has no CPU backward (torch 2.13 raises
                               NotImplementedError), so it cannot train there; sdpa_packed can.
    flash_varlen without CUDA or flash_attn is a ValueError naming the setting."""
    if impl not in ATTN_IMPLS:
        raise ValueError(f"trainer.attn_impl: {impl!r} is none of {', '.join(ATTN_IMPLS)}")
    cuda = torch.device(device).type == "cuda"
    if impl == "flash_varlen" and not (cuda and _flash_attn_importable()):
        missing = "the model on CUDA" if not cuda else "the flash_attn package (pip install flash-attn)"
        raise ValueError(f"trainer.attn_impl=flash_varlen needs {missing}; use auto, flex or sdpa_packed")
    if impl != "auto":
        return impl
    return ("flash_varlen" if _flash_attn_importable() else "flex") if cuda else "sdpa_packed"


def _model_device(model: nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    return torch.device("cpu") if param is None else param.device


def use_packed_attention(model: nn.Module, impl: str = "auto") -> nn.Module:
    """Run a transformers model on the packed-row attention trainer.attn_impl names (resolve_attn_impl, on
    the model's device): sdpa_packed (SDPA per trajectory, a Python loop), flex (one FlexAttention
    kernel, document BlockMask) or flash_varlen (transformers' flash_attention_2, varlen from the position
    ids). All three equal "sdpa" on padded rows and single sequences, and keep attention inside each
    trajectory of a packed row without an [L, L] mask (1 GiB and L^2 scores at L = 32k). A model on sdpa
    or one of these is switched; others are kept (eager builds the mask itself). Returns the model."""
    from transformers import AttentionInterface, AttentionMaskInterface  # lazy: heavy

    AttentionInterface.register(PACKED_SDPA, _packed_sdpa_attention)
    AttentionMaskInterface.register(PACKED_SDPA, _packed_sdpa_mask)
    AttentionInterface.register(PACKED_FLEX, _packed_flex_attention)
    AttentionMaskInterface.register(PACKED_FLEX, _packed_sdpa_mask)  # the same: none on packed rows
    target = _REGISTERED[resolve_attn_impl(impl, _model_device(model))]
    current = getattr(model.config, "_attn_implementation", None)
    if current in ("sdpa", PACKED_SDPA, PACKED_FLEX, "flash_attention_2") and current != target:
        model.set_attn_implementation(target)
    return model


def use_packed_sdpa(model: nn.Module) -> nn.Module:
    """use_packed_attention(model, "sdpa_packed")."""
    return use_packed_attention(model, "sdpa_packed")


def _sequence_starts(input_ids: torch.Tensor, position_ids: torch.Tensor | None) -> torch.Tensor:
    """[B, T] bool: the first token of each sequence (column 0 of padded rows, position id 0 of packed)."""
    if position_ids is not None:
        return position_ids == 0
    starts = torch.zeros(input_ids.shape, dtype=torch.bool, device=input_ids.device)
    starts[:, 0] = True
    return starts


def policy_token_logprobs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                          action_mask: torch.Tensor, temperature: float = 1.0, top_k: int = 0,
                          top_p: float = 1.0, chunk_size: int = 1024,
                          position_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A causal LM's logprobs and entropies at the action tokens -> (logp [B, T], entropy [B, T]).

    Logits are computed only at the positions that predict action tokens, in chunks; the output is 0
    at every other position. `model` is a transformers causal LM (`base_model` + output embeddings).
    Padded rows: attention_mask; packed rows: position_ids and attention_mask=None (module doc).
    """
    if action_mask.shape != input_ids.shape:
        raise ValueError(f"action_mask {tuple(action_mask.shape)} must match input_ids {tuple(input_ids.shape)}")
    if (action_mask & _sequence_starts(input_ids, position_ids)).any():
        raise ValueError("action_mask: an action token at position 0 of a sequence (a packed trajectory's "
                         "first token too) has no context to be predicted from")
    hidden = hidden_states(model.base_model, input_ids, attention_mask, position_ids)
    predicted = action_mask[:, 1:]  # token t+1 is predicted at position t
    head = model.get_output_embeddings()
    logp, entropy = chunked_token_logprobs(hidden[:, :-1][predicted], head.weight, input_ids[:, 1:][predicted],
                                           bias=head.bias, temperature=temperature, top_k=top_k, top_p=top_p,
                                           chunk_size=chunk_size)
    zeros = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    return zeros.masked_scatter(action_mask, logp), zeros.masked_scatter(action_mask, entropy)


# --- the critic ---------------------------------------------------------------------------------

class Critic(nn.Module):
    """The policy's transformer with the LM head replaced by a scalar head: V = Linear(hidden, 1).

    `backbone` is the base model (e.g. Qwen3MoeModel, the causal LM's `.model`). The value head is
    fp32 and starts at zero (V = 0 everywhere before training) [choice].
    """

    def __init__(self, backbone: nn.Module):
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(backbone.config.hidden_size, 1, dtype=torch.float32)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    @classmethod
    def from_policy(cls, policy: nn.Module) -> Critic:
        """A critic initialised from an in-memory policy (a copy of its base model); from a policy on
        the meta device, a critic on the meta device (a sharded build loads its weights)."""
        meta = next(policy.parameters()).is_meta
        backbone = copy.deepcopy(policy.base_model)
        with torch.device("meta") if meta else contextlib.nullcontext():
            return cls(backbone)

    @classmethod
    def from_pretrained(cls, path: str, **kwargs) -> Critic:
        """A critic initialised from the policy checkpoint at `path` (the base model only)."""
        from transformers import AutoModel  # lazy: heavy
        return cls(AutoModel.from_pretrained(path, **kwargs))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Values [B, T], fp32, token-aligned: V[:, t] = head(h[:, t-1]); V = 0 at each sequence's first
        token (column 0 of padded rows; position id 0 of packed rows, see the module doc)."""
        hidden = hidden_states(self.backbone, input_ids, attention_mask, position_ids)
        with torch.autocast(device_type=hidden.device.type, enabled=False):  # the value head runs in fp32
            values = self.value_head(hidden[:, :-1].float()).squeeze(-1)
        values = torch.nn.functional.pad(values, (1, 0))
        return values.masked_fill(_sequence_starts(input_ids, position_ids), 0.0)


def save_critic(critic: Critic, directory: str | Path) -> Path:
    """Write the backbone's config.json and all critic weights to critic.safetensors."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    critic.backbone.config.save_pretrained(directory)
    save_model(critic, str(directory / CRITIC_WEIGHTS))
    return directory


def load_critic(directory: str | Path, weights: bool = True) -> Critic:
    """Rebuild a critic saved by save_critic (architecture from config.json, weights from safetensors).
    Built in fp32, so saved fp32 master weights load exactly (config.json's dtype would round them).
    weights=False: on the meta device, no weights read (a sharded build reads each rank's shard)."""
    from transformers import AutoConfig, AutoModel  # lazy: heavy
    directory = Path(directory)
    if not (directory / CRITIC_WEIGHTS).is_file():
        raise ValueError(f"directory {directory} holds no {CRITIC_WEIGHTS}")
    config = AutoConfig.from_pretrained(directory)
    if not weights:
        with torch.device("meta"):
            return Critic(AutoModel.from_config(config, dtype=torch.float32))
    critic = Critic(AutoModel.from_config(config, dtype=torch.float32))
    load_model(critic, str(directory / CRITIC_WEIGHTS))
    return critic


# --- freezing -----------------------------------------------------------------------------------

ATTENTION = r"(^|\.)self_attn\."  # every self-attention parameter (q/k/v/o projections, q/k norms)
NORMS = r"norm\.(weight|bias)$"  # input/post-attention layer norms and the final norm
ROUTER = r"(^|\.)mlp\.gate\.weight$"  # the MoE router (not the dense MLP's gate_proj)
EMBEDDINGS = r"(^|\.)embed_tokens\."


def critic_freeze_patterns(preset: str = "attention", norms: bool = True, router: bool = True,
                           embeddings: bool = True) -> list[str]:
    """Regexes of the critic's frozen parameters. "none" freezes nothing; "attention" freezes
    self-attention, plus norms / router / embeddings as switched (the MoE experts and the value head
    always train)."""
    if preset == "none":
        return []
    if preset != "attention":
        raise ValueError(f"preset must be 'none' or 'attention', got {preset!r}")
    return [ATTENTION] + [p for p, on in ((NORMS, norms), (ROUTER, router), (EMBEDDINGS, embeddings)) if on]


def freeze_parameters(model: nn.Module, patterns: list[str]) -> list[str]:
    """Set requires_grad=False on every parameter whose name matches a pattern (re.search); return
    the frozen names. A pattern matching no parameter is an error (a renamed module would otherwise
    silently train)."""
    names = [name for name, _ in model.named_parameters()]
    for pattern in patterns:
        if not any(re.search(pattern, n) for n in names):
            raise ValueError(f"freeze pattern {pattern!r} matches no parameter of {type(model).__name__}")
    frozen = []
    for name, param in model.named_parameters():
        if any(re.search(p, name) for p in patterns):
            param.requires_grad_(False)
            frozen.append(name)
    return frozen
