"""Checkpoints of `sao train`: written atomically, the newest `trainer.keep_checkpoints` kept.

    <run>/checkpoints/
        latest              one line: the name of the newest complete checkpoint (replaced atomically)
        step-000003/
            policy/         transformers `save_pretrained` (safetensors) + the tokenizer: loads with
                            `from_pretrained`, and serves as `model.path` of an engine
            critic/         `save_critic` (config.json + critic.safetensors); absent without a critic
            optimizers.pt   policy and critic AdamW states, the running-mean baseline
            rng.pt          python, numpy and torch RNG states
            state.json      step, policy version, counters, and the position in the trace stream: the
                            traj ids consumed so far, in order (trained, excluded or dropped)

Writing: everything goes to `checkpoints/.tmp-step-000003-<random>/`, every file and directory is
fsynced, the directory is renamed to `step-000003` (atomic), the parent fsynced; then `latest` is
written to a temporary file, fsynced and renamed over the old one. A kill at any moment leaves the
previous checkpoint complete and `latest` naming a complete checkpoint.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import uuid
from pathlib import Path

import torch

from core.files import atomic_write_text, fsync_dir

LATEST = "latest"
STATE = "state.json"


def checkpoints_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(Path(dirpath))


def rng_state() -> dict:
    import numpy as np

    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    import numpy as np

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(run_dir: str | Path, step: int, *, policy, critic, trainer, tokenizer, state: dict,
                    keep: int) -> Path:
    """Write checkpoint `step` (see the module doc) and point `latest` at it; return its directory."""
    from trainer.models import save_critic

    root = checkpoints_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:06d}"
    tmp = root / f".tmp-{name}-{uuid.uuid4().hex[:8]}"
    final = root / name
    try:
        policy.save_pretrained(tmp / "policy", safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp / "policy")
        if critic is not None:
            save_critic(critic, tmp / "critic")
        optim = {"policy": trainer.policy_optimizer.state_dict(),
                 "critic": trainer.critic_optimizer.state_dict() if trainer.critic_optimizer is not None else None,
                 "baseline": trainer.baseline.state_dict() if trainer.baseline is not None else None}
        torch.save(optim, tmp / "optimizers.pt")
        torch.save(rng_state(), tmp / "rng.pt")
        (tmp / STATE).write_text(json.dumps({**state, "step": step}, indent=1))
        _fsync_tree(tmp)
        if final.exists():  # a checkpoint of this step from a lineage that was rolled back
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_dir(root)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    atomic_write_text(root / LATEST, name + "\n")
    for old in list_checkpoints(run_dir)[:-keep]:
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step-*") if p.is_dir() and (p / STATE).is_file())


def clean_partial(run_dir: str | Path) -> int:
    """Remove what a writer killed mid-checkpoint left behind (only the run's own process may call this)."""
    root = checkpoints_dir(run_dir)
    leftovers = list(root.glob(".tmp-*")) + list(root.glob(f".{LATEST}.*.tmp")) if root.is_dir() else []
    for path in leftovers:
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    return len(leftovers)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The checkpoint `latest` names (else the newest complete one), or None. Read-only."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return None
    pointer = root / LATEST
    if pointer.is_file():
        named = root / pointer.read_text().strip()
        if (named / STATE).is_file():
            return named
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def read_state(ckpt: str | Path) -> dict:
    return json.loads((Path(ckpt) / STATE).read_text())


def restore_optimizers(ckpt: str | Path, trainer) -> None:
    """Load the optimizer (and baseline) states into an `SAOTrainer` built on the checkpoint's models."""
    optim = torch.load(Path(ckpt) / "optimizers.pt", weights_only=False)
    trainer.policy_optimizer.load_state_dict(optim["policy"])
    if trainer.critic_optimizer is not None and optim["critic"] is not None:
        trainer.critic_optimizer.load_state_dict(optim["critic"])
    if trainer.baseline is not None and optim["baseline"] is not None:
        trainer.baseline.load_state_dict(optim["baseline"])


def restore_rng(ckpt: str | Path) -> None:
    set_rng_state(torch.load(Path(ckpt) / "rng.pt", weights_only=False))
