"""Where the critic starts, and what of it trains (docs/algorithm.md sections 4.5, 8).

    initial_critic        what `sao train` starts from: trainer.value_pretrain_checkpoint, or a copy of
                          the policy's base model with a zero value head
    load_backbone_critic  what `sao value-pretrain` starts from: model.path's base model, zero value head
    freeze_critic         trainer.critic_freeze* applied (as SAOTrainer does)

Below the stages that use it (trainer.warm.value_pretrain, trainer.run.loop, trainer.dist.distributed's sharded build).
"""
from __future__ import annotations

from pathlib import Path

import torch

from sao_harness.core.errors import UserError
from sao_harness.trainer.config import TrainerConfig
from sao_harness.trainer.modeling.models import Critic, critic_freeze_patterns, freeze_parameters, load_critic


def freeze_critic(critic: Critic, trainer: TrainerConfig) -> list[str]:
    """Freeze the critic as `trainer.critic_freeze*` configures it (as SAOTrainer does); frozen names."""
    patterns = critic_freeze_patterns(trainer.critic_freeze, trainer.critic_freeze_norms,
                                      trainer.critic_freeze_router, trainer.critic_freeze_embeddings)
    return freeze_parameters(critic, patterns)


def load_backbone_critic(model_path: str, dtype: str = "float32") -> Critic:
    """Critic.from_pretrained(model_path) without transformers' load report (the policy's lm_head is
    expected to be left out); a backbone weight missing from the checkpoint is a UserError."""
    from transformers import AutoModel  # lazy: heavy
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        backbone, info = AutoModel.from_pretrained(model_path, dtype=getattr(torch, dtype), output_loading_info=True)
    except OSError as e:
        raise UserError(f"model.path: cannot load {model_path}: {str(e).splitlines()[0]}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    if info.get("missing_keys"):
        missing = sorted(info["missing_keys"])
        raise UserError(f"model.path: {model_path} lacks {len(missing)} backbone weights (e.g. {missing[0]}); "
                        "the critic would start from random weights")
    return Critic(backbone)


def initial_critic(trainer: TrainerConfig, policy: torch.nn.Module) -> Critic:
    """The critic `sao train` starts from: the value-pretraining checkpoint when
    `trainer.value_pretrain_checkpoint` is set (checked against the policy's architecture; kept in fp32,
    the dtype of the masters it holds: a cast to a bf16 policy's dtype would round away the pretraining
    change, and SAOTrainer makes fp32 masters of it anyway, computing in the policy's dtype), else a
    fresh Critic.from_policy(policy). A policy on the meta device (trainer.dist.distributed.build_sharded)
    gives a critic on the meta device: its weights are read later."""
    path = trainer.value_pretrain_checkpoint
    if path is None:
        return Critic.from_policy(policy)
    if not Path(path).is_dir():
        raise UserError(f"trainer.value_pretrain_checkpoint: directory not found: {path} "
                        "(run `sao value-pretrain` first)")
    try:
        critic = load_critic(path, weights=not next(policy.parameters()).is_meta)
    except (ValueError, OSError) as e:
        raise UserError(f"trainer.value_pretrain_checkpoint: {e}") from None
    mine, theirs = critic.backbone.config, policy.config
    for key in ("model_type", "hidden_size", "num_hidden_layers", "vocab_size"):
        if getattr(mine, key, None) != getattr(theirs, key, None):
            raise UserError(f"trainer.value_pretrain_checkpoint: {path} has {key}={getattr(mine, key, None)!r} "
                            f"but the policy has {getattr(theirs, key, None)!r} (pretrained from another model?)")
    return critic
