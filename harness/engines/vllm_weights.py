"""Weights on their way into vLLM: byte buckets, and the names vLLM's loader expects.

- Buckets (``plan`` / ``pack`` / ``unpack``): tensors packed into ``uint8`` buffers of at most
  ``bucket_bytes`` (a larger tensor alone), each tensor at a 16-byte aligned offset so that a byte view
  can be re-typed. The plan is plain values (it crosses an actor call or vLLM's ``collective_rpc``).
  ``runtime.weight_sync`` broadcasts the same buckets from the trainer to the replicas.
- Names (``to_checkpoint_names``): the trainer publishes its model's state dict, transformers 5's
  names. For the MoE families below that is one fused tensor per layer for all experts
  (``mlp.experts.gate_up_proj`` ``[E, 2I, H]``, gate rows first, and ``mlp.experts.down_proj``
  ``[E, H, I]``: ``Qwen3MoeExperts``), while vLLM's loader maps the per-expert checkpoint names
  (``FusedMoE.make_expert_params_mapping``: ``mlp.experts.{e}.gate_proj.weight`` -> ``w13`` shard
  ``w1``, ``up_proj`` -> ``w3``, ``down_proj`` -> ``w2``), as ``save_pretrained`` writes them. The
  fused tensors are split into per-expert views (no copy until packed), as verl does.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

ALIGN = 16  # bytes: every tensor starts at an aligned offset of its bucket, so a byte view can be re-typed
# model_type -> the families whose fused expert tensors are laid out as transformers' Qwen3MoeExperts
FUSED_EXPERT_FAMILIES = frozenset({"qwen3_moe", "qwen2_moe"})
FUSED_GATE_UP = ".mlp.experts.gate_up_proj"
FUSED_DOWN = ".mlp.experts.down_proj"


def plan(weights: dict[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> list[dict]:
    """Buckets of at most `bucket_bytes` (a larger tensor alone): `{"nbytes", "items": [(name, dtype,
    shape, offset, nbytes)]}`, in the given order; plain values (an actor call's arguments)."""
    pairs = weights.items() if isinstance(weights, dict) else weights
    buckets, items, size = [], [], 0
    for name, t in pairs:
        n = t.numel() * t.element_size()
        if items and size + n > bucket_bytes:
            buckets.append({"nbytes": size, "items": items})
            items, size = [], 0
        items.append((name, str(t.dtype).removeprefix("torch."), list(t.shape), size, n))
        size += -(-n // ALIGN) * ALIGN
    if items:
        buckets.append({"nbytes": size, "items": items})
    return buckets


def pack(weights: dict[str, torch.Tensor], bucket: dict, device) -> torch.Tensor:
    """One bucket's tensors in one ``uint8`` buffer on ``device``."""
    buf = torch.empty(bucket["nbytes"], dtype=torch.uint8, device=device)
    for name, _, _, offset, n in bucket["items"]:
        buf[offset:offset + n].copy_(weights[name].detach().contiguous().reshape(-1).view(torch.uint8))
    return buf


def unpack(buf: torch.Tensor, bucket: dict) -> dict[str, torch.Tensor]:
    """Views of ``buf``: name -> tensor (no copy)."""
    return {name: buf[offset:offset + n].view(getattr(torch, dtype)).view(shape)
            for name, dtype, shape, offset, n in bucket["items"]}


def to_checkpoint_names(weights: dict[str, torch.Tensor], model_type: str | None) -> Iterator[tuple[str, torch.Tensor]]:
    """``weights`` with fused expert tensors split into the per-expert names vLLM's loader maps (module doc);
    other tensors, and every tensor of a family not in ``FUSED_EXPERT_FAMILIES``, pass unchanged."""
    fused = model_type in FUSED_EXPERT_FAMILIES
    for name, t in weights.items():
        if fused and name.endswith(FUSED_GATE_UP) and t.dim() == 3:
            base = name.removesuffix(".gate_up_proj")
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                yield f"{base}.{e}.gate_proj.weight", t[e, :inter]
                yield f"{base}.{e}.up_proj.weight", t[e, inter:]
        elif fused and name.endswith(FUSED_DOWN) and t.dim() == 3:
            base = name.removesuffix(".down_proj")
            for e in range(t.shape[0]):
                yield f"{base}.{e}.down_proj.weight", t[e]
        else:
            yield name, t
