"""Routing replay (R3, arXiv 2510.11370): the policy's MoE routers take the experts the engine took.

On an MoE policy the engine and the trainer can pick different experts for the same token (bf16 vs
fp32 masters, other kernels), and then the trainer's logprob is of another computation than the one
that was sampled. The engine records its choices (the trace's ``routed_experts``, harness.engines.routes);
in the policy's forward each router of layer l, at a token t with a recorded route e_{t,l}, uses

    experts   = e_{t,l}                                    (the engine's, not top-k of the trainer's probs)
    weights   = p_{t,l}[e] / sum_{e' in e_{t,l}} p_{t,l}[e']   (norm_topk_prob; p[e] without it)
    p_{t,l}   = softmax(W_l h_{t,l})                         (the trainer's own router, differentiated)

so the gate weights, and the router's gradient, stay the trainer's; a token without a route (-1: the
trace's last token) routes as the trainer's router does. Route agreement, logged as
``rollout/route_agreement``, is |top-k(p_{t,l}) & e_{t,l}| / k averaged over routed (token, layer): the
fraction of the engine's choices the trainer's router makes itself.

Only the policy replays (recompute and update). The critic routes on its own: its values are compared
with no engine quantity, so there is no mismatch to remove, and its experts train apart from the
policy's, so the policy engine's routes are not its computation.
Activation checkpointing recomputes a layer in backward: the routes stay set until the backward is
done (``replaying`` wraps forward and backward), so the recompute routes as the forward did.
"""
from __future__ import annotations

import contextlib
import types

import torch
from torch import nn

from sao_harness.harness.engines.routes import moe_routers

# routers whose forward is softmax -> top-k -> (renormalise): the math `_replayed` mirrors
SOFTMAX_TOPK_ROUTERS = ("Qwen3MoeTopKRouter", "Qwen2MoeTopKRouter")


class RouterReplay:
    """Patches the routers of ``model`` (in place) to replay routes inside ``replaying(routes)``.

    ``routes``: [tokens of the forward (batch-major), MoE layers, top_k] integer tensor, -1 = none.
    ``observe=True``: measure the agreement but route as the trainer does (replay off).
    """

    def __init__(self, model: nn.Module):
        self.routers = moe_routers(model)
        for router in self.routers:
            if type(router).__name__ not in SOFTMAX_TOPK_ROUTERS:
                raise ValueError(f"trainer.router_replay: {type(router).__name__} is not a softmax top-k router "
                                 f"({', '.join(SOFTMAX_TOPK_ROUTERS)}); replay would change its math")
        self.shape = (len(self.routers), int(self.routers[0].top_k)) if self.routers else None
        self.num_experts = int(self.routers[0].num_experts) if self.routers else 0
        self._routes: torch.Tensor | None = None
        self._observe = False
        self._counted: set[int] = set()
        self._agree_t: list[torch.Tensor] = []  # per routed forward and layer: (matching choices, choices)
        for layer, router in enumerate(self.routers):
            router.forward = types.MethodType(self._forward(layer), router)

    @property
    def is_moe(self) -> bool:
        return bool(self.routers)

    @contextlib.contextmanager
    def replaying(self, routes: torch.Tensor | None, observe: bool = False):
        """Inside: every router forward reads its layer's routes (None: no replay, nothing measured)."""
        if routes is not None and tuple(routes.shape[1:]) != self.shape:
            raise ValueError(f"routes of shape {tuple(routes.shape)}, the policy routes [tokens, {self.shape[0]} MoE "
                             f"layers, top_k {self.shape[1]}]")
        self._routes, self._observe, self._counted = routes, observe, set()
        try:
            yield
        finally:
            self._routes = None

    def agreement(self) -> tuple[float, float]:
        """(matching choices, choices) over the routed forwards since the last call, and reset: the route
        agreement is their ratio (counts, so that data-parallel ranks sum them)."""
        totals = torch.stack(self._agree_t).sum(0).tolist() if self._agree_t else [0.0, 0.0]  # one host sync
        self._agree_t = []
        return totals[0], totals[1]

    def _forward(self, layer: int):
        def forward(router, hidden_states):
            # a deep copy of a patched model (its router is not ours) routes natively, never on our routes
            if self._routes is None or router is not self.routers[layer]:
                return type(router).forward(router, hidden_states)
            return self._replayed(router, layer, hidden_states, self._routes)
        return forward

    def _replayed(self, router, layer: int, hidden_states: torch.Tensor, routes: torch.Tensor):
        hidden_states = hidden_states.reshape(-1, router.hidden_dim)
        logits = nn.functional.linear(hidden_states, router.weight)
        probs = torch.softmax(logits, dtype=torch.float, dim=-1)
        own_weights, own = torch.topk(probs, router.top_k, dim=-1)
        engine = routes[:, layer].to(device=own.device, dtype=torch.long)
        if engine.shape[0] != own.shape[0]:
            raise ValueError(f"routes: {engine.shape[0]} routed tokens for a forward of {own.shape[0]}")
        routed = engine[:, 0] >= 0
        if layer not in self._counted:  # the first forward of this context, not a checkpointing recompute
            self._counted.add(layer)
            matches = (own[:, :, None] == engine[:, None, :]).any(-1).sum(-1)
            self._agree_t.append(torch.stack([matches[routed].sum().double(),
                                              routed.sum().double() * router.top_k]))
        if self._observe:
            indices, weights = own, own_weights
        else:
            indices = torch.where(routed[:, None], engine, own)
            weights = probs.gather(-1, indices)
        if router.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return logits, weights.to(logits.dtype), indices


def check_routes(routes: torch.Tensor, replay: RouterReplay, where: str) -> None:
    """Refuse routes that are not of this policy: another shape, or an expert index out of range."""
    if tuple(routes.shape[1:]) != replay.shape:
        raise ValueError(f"{where}: routed_experts of shape [*, {', '.join(map(str, routes.shape[1:]))}], the policy "
                         f"routes [*, {replay.shape[0]} MoE layers, top_k {replay.shape[1]}] (another model's routes?)")
    if routes.numel() and (int(routes.max()) >= replay.num_experts or int(routes.min()) < -1):
        raise ValueError(f"{where}: routed_experts holds expert ids outside [-1, {replay.num_experts}) (another "
                         "model's routes?)")
