"""Which model an evaluation runs, and the names it gets.

``resolve_policy(cfg) -> Policy`` reads ``eval.checkpoint``: None = ``model.path``; ``latest`` = the
run's newest checkpoint (``trainer.dist.checkpoint.resolve_checkpoint``); a trainer checkpoint dir (its
``policy/`` is loaded); a model dir (``config.json`` + a tokenizer); a Hugging Face model id.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from sao_harness.core.errors import UserError
from sao_harness.harness.tiny_model import resolve_model_path
from sao_harness.trainer.dist.checkpoint import POLICY_CONFIG, checkpoints_dir, resolve_checkpoint

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


@dataclass
class Policy:
    model_path: str  # what the engine loads (model.path of the eval run)
    model_name: str  # model_name_or_path in predictions
    tag: str  # short name for the eval directory
    checkpoint: str | None  # the checkpoint as configured


def slug(text: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_.-]+", "_", text.replace("/", "__")).strip("._-")
    return s or "model"


def _is_model_dir(p: Path) -> bool:
    return (p / "config.json").is_file()


def _base_model(cfg) -> Policy:
    """``eval.checkpoint`` None: the run's ``model.path``."""
    path = resolve_model_path(cfg.model)
    exists = Path(cfg.model.path).exists()
    name = cfg.model.path if cfg.model.path == "tiny" or not exists else path
    tag = "tiny" if cfg.model.path == "tiny" else slug(Path(cfg.model.path).name if exists else cfg.model.path)
    return Policy(path, name, tag, None)


def resolve_policy(cfg) -> Policy:
    """The model the eval runs (see the module doc); a clear error for a bad one."""
    ck = cfg.eval.checkpoint
    if ck is None:
        return _base_model(cfg)
    p = resolve_checkpoint(ck, cfg.run.dir, need=POLICY_CONFIG)
    if p is None:
        raise UserError(f"eval.checkpoint=latest: no checkpoint (a directory with {POLICY_CONFIG}) under "
                        f"{checkpoints_dir(cfg.run.dir)}; train first (sao train) or name one")
    if p.exists():
        if _is_model_dir(p / "policy"):
            model, tag = p / "policy", p.name
        elif _is_model_dir(p):
            model, tag = p, (p.parent.name if p.name == "policy" else p.name)
        else:
            raise UserError(f"eval.checkpoint {ck}: neither a trainer checkpoint (policy/config.json) nor a model "
                            "directory (config.json)")
        if not any((model / f).is_file() for f in TOKENIZER_FILES):
            raise UserError(f"eval.checkpoint {ck}: {model} has no tokenizer (tokenizer.json / tokenizer_config.json); "
                            "save the tokenizer with the policy")
        return Policy(str(model), f"{slug(cfg.run.name)}-{slug(tag)}", slug(tag), str(ck))
    if re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", ck) and not ck.startswith((".", "/", "~")):
        return Policy(ck, ck, slug(ck.split("/")[-1]), ck)  # a Hugging Face model id
    raise UserError(f"eval.checkpoint {ck}: not found (a checkpoint dir, a model dir, a Hugging Face id or 'latest')")


def dataset_tag(dataset: str) -> str:
    if dataset == "bundled" or "/" not in dataset and not Path(dataset).exists():
        return slug(dataset)
    p = Path(dataset)
    if p.exists():
        return slug(p.stem if p.is_file() else p.name)
    return slug(dataset.split("/")[-1])


def eval_name(cfg, policy: Policy) -> str:
    """The eval directory ``<run.dir>/eval/<name>``: ``eval.name``, else ``<policy tag>.<dataset tag>``."""
    return cfg.eval.name or f"{policy.tag}.{dataset_tag(cfg.eval.dataset)}"
