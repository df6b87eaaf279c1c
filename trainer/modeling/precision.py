"""Mixed precision and the training mode of the trainable modules.

    master weights   the policy and the critic live in fp32; AdamW updates the fp32 copy (an lr 1e-6
                     step is far below bf16's spacing of ~2^-8 relative, so a bf16 weight would not move)
    compute          torch.autocast(device, model dtype) around every forward; the backward follows
                     the autocast graph and the gradients land on the fp32 masters. bfloat16 or float32
                     only: float16 would need loss scaling (no GradScaler here), so it is refused
    publish / serve  engine_weights(policy, dtype): the masters cast to the engine's (model) dtype

Training mode: transformers checkpoints activations only when `module.training` is True, so the
trainer runs its passes in train mode; `train_mode` refuses a model with a dropout probability > 0
(the engine samples without dropout, so the trainer must compute the same distribution).
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from sao_harness.trainer.config import FLOAT16_UNSUPPORTED


def model_dtype(module: nn.Module) -> torch.dtype:
    """The dtype of the module's floating-point parameters (the dtype it was loaded in)."""
    dtypes = {p.dtype for p in module.parameters() if p.is_floating_point()}
    if len(dtypes) > 1:  # e.g. a bf16 backbone under an fp32 value head: the backbone's dtype
        dtypes.discard(torch.float32)
    if len(dtypes) != 1:
        raise ValueError(f"{type(module).__name__}: parameters in several dtypes {sorted(map(str, dtypes))}")
    return dtypes.pop()


def to_master_weights(module: nn.Module) -> nn.Module:
    """Cast the module's floating-point parameters and buffers to fp32, in place (the master copy)."""
    return module.float()




def autocast(device: torch.device, dtype: torch.dtype):
    """The forward-pass context: autocast to `dtype` on `device`, a no-op for fp32. float16 is refused
    (FLOAT16_UNSUPPORTED): its backward needs a loss scaler, which no training pass has."""
    if dtype == torch.float16:
        raise ValueError(FLOAT16_UNSUPPORTED)
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def engine_weights(policy: nn.Module, dtype: torch.dtype | str) -> dict[str, torch.Tensor]:
    """The policy's state dict with floating-point tensors cast to `dtype` (the engine's), detached."""
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    return {name: t.detach().to(dtype) if t.is_floating_point() else t.detach()
            for name, t in policy.state_dict().items()}


def enable_activation_checkpointing(model: nn.Module) -> None:
    """transformers' gradient checkpointing, non-reentrant: it recomputes each layer in backward and,
    unlike the reentrant form, still back-propagates when the layer inputs need no gradient (a critic
    with frozen embeddings)."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def _dropouts(module: nn.Module) -> dict[str, float]:
    found = {name: m.p for name, m in module.named_modules() if isinstance(m, nn.Dropout) and m.p > 0}
    for sub in module.modules():
        config = getattr(sub, "config", None)
        for key, value in (vars(config).items() if config is not None else ()):
            if "dropout" in key and isinstance(value, float) and value > 0:
                found[f"config.{key}"] = value
    return found


def train_mode(module: nn.Module) -> None:
    """module.train(True), after checking that no dropout would fire (see the module doc)."""
    found = _dropouts(module)
    if found:
        raise ValueError(f"{type(module).__name__}: dropout > 0 ({found}); the trainer needs the engine's "
                         "distribution, set every dropout to 0")
    module.train(True)
