"""Checkpoints of `sao train`: written atomically, the newest `trainer.keep_checkpoints` kept.

    <run>/checkpoints/
        latest              one line: the name of the newest complete checkpoint (replaced atomically)
        step-000003/
            policy/         transformers `save_pretrained` (safetensors) in the model dtype + the
                            tokenizer: loads with `from_pretrained`, serves as `model.path` of an engine
            policy_master.safetensors   the policy's fp32 master weights (exact resume)
            critic/         `save_critic` (config.json + critic.safetensors, fp32 master weights);
                            absent without a critic
            optimizers.pt   policy and critic AdamW states, the running-mean baseline
            rng.pt          python, numpy, torch (and CUDA) RNG states
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

import numpy as np
import torch
from safetensors.torch import load_model, save_model

from core.files import atomic_write_text, fsync_dir
from trainer.models import save_critic
from trainer.precision import engine_weights

LATEST = "latest"
POLICY_MASTER = "policy_master.safetensors"
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
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(run_dir: str | Path, step: int, *, policy, critic, trainer, tokenizer, state: dict,
                    keep: int) -> Path:
    """Write checkpoint `step` (see the module doc) and point `latest` at it; return its directory.
    `trainer.dtype` is the model dtype the servable policy/ is written in."""
    root = checkpoints_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:06d}"
    tmp = root / f".tmp-{name}-{uuid.uuid4().hex[:8]}"
    final = root / name
    try:
        policy.save_pretrained(tmp / "policy", state_dict=engine_weights(policy, trainer.dtype),
                               safe_serialization=True)
        _set_config_dtype(tmp / "policy" / "config.json", trainer.dtype)
        save_model(policy, str(tmp / POLICY_MASTER))
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


def _step(ckpt: Path) -> int:
    """The step of a checkpoint directory `step-N` (N zero-padded or not)."""
    digits = ckpt.name.removeprefix("step-")
    return int(digits) if digits.isdigit() else -1


def list_checkpoints(run_dir: str | Path, *, need: str = STATE) -> list[Path]:
    """Complete checkpoints (a `step-N` directory holding `need`), oldest (lowest step) first."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    return sorted((p for p in root.glob("step-*") if _step(p) >= 0 and (p / need).is_file()), key=_step)


def clean_partial(run_dir: str | Path) -> int:
    """Remove what a writer killed mid-checkpoint left behind (only the run's own process may call this)."""
    root = checkpoints_dir(run_dir)
    leftovers = list(root.glob(".tmp-*")) + list(root.glob(f".{LATEST}.*.tmp")) if root.is_dir() else []
    for path in leftovers:
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    return len(leftovers)


POLICY_CONFIG = "policy/config.json"  # what makes a checkpoint servable (`sao eval`, the demo)


def resolve_checkpoint(spec: str | Path, run_dir: str | Path, *, need: str = STATE) -> Path | None:
    """The one rule that names a checkpoint (trainer resume, `sao eval`, the demo). Read-only.

    `spec` = "latest": the checkpoint the `latest` pointer names when it holds `need`, else the
    complete checkpoint of the highest step, else None (the run has none yet). Any other `spec` is a
    directory, returned as given (the caller checks what it holds). `need` is the file the caller
    reads: `state.json` to resume training, `policy/config.json` to serve the policy.
    """
    if str(spec) != LATEST:
        return Path(spec)
    root = checkpoints_dir(run_dir)
    pointer = root / LATEST
    if pointer.is_file():
        named = pointer.read_text().strip()
        if named and (root / named / need).is_file():
            return root / named
    found = list_checkpoints(run_dir, need=need)
    return found[-1] if found else None


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The checkpoint to resume from: `resolve_checkpoint("latest", run_dir)`."""
    return resolve_checkpoint(LATEST, run_dir)


def read_state(ckpt: str | Path) -> dict:
    return json.loads((Path(ckpt) / STATE).read_text())


def _set_config_dtype(config_json: Path, dtype: torch.dtype) -> None:
    """policy/config.json names the dtype its weights are stored in (save_pretrained wrote the master's)."""
    config = json.loads(config_json.read_text())
    for key in ("dtype", "torch_dtype"):
        if key in config:
            config[key] = str(dtype).removeprefix("torch.")
    config_json.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def restore_optimizers(ckpt: str | Path, trainer) -> None:
    """Load the training state into an `SAOTrainer` built on the checkpoint's models: the policy's fp32
    master weights (policy/ holds them rounded to the model dtype), then the optimizer and baseline
    states. The critic's directory holds its fp32 masters already."""
    if (Path(ckpt) / POLICY_MASTER).is_file():  # a checkpoint from before master weights: policy/ only
        load_model(trainer.policy, str(Path(ckpt) / POLICY_MASTER), device=str(trainer.device))
    optim = torch.load(Path(ckpt) / "optimizers.pt", weights_only=False)
    trainer.policy_optimizer.load_state_dict(optim["policy"])
    if trainer.critic_optimizer is not None and optim["critic"] is not None:
        trainer.critic_optimizer.load_state_dict(optim["critic"])
    if trainer.baseline is not None and optim["baseline"] is not None:
        trainer.baseline.load_state_dict(optim["baseline"])


def restore_rng(ckpt: str | Path) -> None:
    set_rng_state(torch.load(Path(ckpt) / "rng.pt", weights_only=False))
