"""Checkpoints of `sao train`: written atomically, the newest `runtime.keep_checkpoints` kept.

Two formats. One process (runtime.world_size = 1) writes the single-file format:

    <run>/checkpoints/
        latest              one line: the name of the newest complete checkpoint (replaced atomically)
        step-000003/
            policy/         transformers `save_pretrained` (safetensors) in the model dtype + the
                            tokenizer: loads with `from_pretrained`, serves as `model.path` of an engine
            policy_master.safetensors   the policy's fp32 master weights (exact resume)
            critic/         `save_critic` (config.json + critic.safetensors, fp32 master weights);
                            absent without a critic
            optimizers.pt   policy and critic AdamW states, the running-mean baseline
            rng.pt          python, numpy, torch (and CUDA) RNG states of the process that trains
            state.json      step, policy version, counters, and the position in the trace stream: the
                            traj ids consumed so far, in order (trained, excluded or dropped)

Data-parallel ranks (runtime.world_size > 1) write the sharded format (`save_sharded_checkpoint`,
every rank calls; nothing is gathered whole):

        step-000003/
            policy/         config.json + model.safetensors in the model dtype, hub tensor names: streamed
                            one gathered tensor at a time by rank 0 (trainer.dist.sharded.write_hf_policy); the
                            tokenizer
            dcp/            torch.distributed.checkpoint: the policy's and the critic's fp32 master
                            weights and both AdamW states, one file of shards per rank (+ .metadata);
                            loads on any world size, or unsharded in one process
            trainer.pt      the running-mean baseline
            rng-rank00000.pt, ...   each rank's own python, numpy, torch (and CUDA) RNG states; a
                            resumed rank r restores rng-rank<r>.pt (a rank the checkpoint has no file
                            for keeps its seeded state)
            rng.pt          the driver's RNG states (trainer.run.ranks passes them; else rank 0's)
            state.json      as above

Both formats load in one process (`restore_optimizers`) and on any number of ranks
(trainer.dist.distributed.build_sharded).

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
import torch.distributed as dist
from safetensors.torch import load_model, save_model
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

from sao_harness.core.files import atomic_write_text, fsync_dir
from sao_harness.trainer.dist import sharded
from sao_harness.trainer.modeling.models import save_critic
from sao_harness.trainer.modeling.precision import engine_weights

LATEST = "latest"
POLICY_MASTER = "policy_master.safetensors"
STATE = "state.json"
DCP_DIR = "dcp"
TRAINER_STATE = "trainer.pt"
RNG = "rng.pt"
RANK_RNG = "rng-rank{rank:05d}.pt"


def checkpoints_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(Path(dirpath))


def rng_state() -> dict:
    """This process's RNG states: python `random`, numpy's global one, torch's CPU one, and every CUDA
    device's where CUDA is available."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what rng_state() returned (the CUDA states only where CUDA is available)."""
    missing = {"python", "numpy", "torch"} - set(state)
    if missing:
        raise ValueError(f"RNG state: no {sorted(missing)} states in it (keys {sorted(state)})")
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def rank_rng_file(directory: str | Path, rank: int) -> Path:
    """Where a data-parallel rank's RNG states live in a checkpoint directory."""
    return Path(directory) / RANK_RNG.format(rank=rank)


def save_rank_rng(directory: str | Path, rank: int) -> Path:
    """Write this rank's rng_state() into `directory` (rank_rng_file); return the file."""
    path = rank_rng_file(directory, rank)
    torch.save(rng_state(), path)
    return path


def restore_rank_rng(ckpt: str | Path, rank: int) -> bool:
    """Set this rank's RNG states from checkpoint `ckpt`'s file for `rank`; False (nothing changed)
    if it has none: a single-file checkpoint, one written before per-rank states, or by fewer ranks."""
    path = rank_rng_file(ckpt, rank)
    if not path.is_file():
        return False
    set_rng_state(torch.load(path, weights_only=False))
    return True


def save_checkpoint(run_dir: str | Path, step: int, *, policy, critic, trainer, tokenizer, state: dict,
                    keep: int) -> Path:
    """Write checkpoint `step` (see the module doc) and point `latest` at it; return its directory.
    `trainer.dtype` is the model dtype the servable policy/ is written in."""
    name, tmp = _tmp_dir(run_dir, step)
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
        return _commit(run_dir, tmp, name, state, step, keep)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _tmp_dir(run_dir: str | Path, step: int) -> tuple[str, Path]:
    """The checkpoint's name and the temporary directory it is written in (not created yet)."""
    root = checkpoints_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:06d}"
    return name, root / f".tmp-{name}-{uuid.uuid4().hex[:8]}"


def _commit(run_dir: str | Path, tmp: Path, name: str, state: dict, step: int, keep: int,
            rng: dict | None = None) -> Path:
    """rng.pt (`rng`, default this process's rng_state()) and state.json into `tmp`, fsync it all, rename
    it to `name`, point `latest` at it, prune."""
    root, final = checkpoints_dir(run_dir), checkpoints_dir(run_dir) / name
    torch.save(rng if rng is not None else rng_state(), tmp / RNG)
    (tmp / STATE).write_text(json.dumps({**state, "step": step}, indent=1))
    _fsync_tree(tmp)
    if final.exists():  # a checkpoint of this step from a lineage that was rolled back
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_dir(root)
    atomic_write_text(root / LATEST, name + "\n")
    for old in list_checkpoints(run_dir)[:-keep]:
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    return final


def save_sharded_checkpoint(run_dir: str | Path, step: int, *, trainer, tokenizer, state: dict,
                            keep: int, rng: dict | None = None) -> Path | None:
    """The sharded format (module doc) of a trainer.dist.distributed rank's trainer; every rank calls (the
    writes are collectives), rank 0 commits it as save_checkpoint does and returns its directory (None
    elsewhere). The ranks write into rank 0's temporary directory (on several nodes: a shared file
    system), each its shards and its own RNG states; rng.pt holds `rng` (the driver's rng_state()),
    or rank 0's."""
    first = sharded.rank() == 0
    where = [_tmp_dir(run_dir, step) if first else None]
    dist.broadcast_object_list(where, src=0)
    name, tmp = where[0]
    try:
        sharded.save_training_state(tmp / DCP_DIR, trainer)  # every rank writes (and fsyncs) its shards
        _fsync_file(save_rank_rng(tmp, sharded.rank()))  # ... and its RNG states (rank 0 fsyncs its own tree)
        sharded.write_hf_policy(tmp / "policy", trainer.policy.lm, trainer.dtype)
        dist.barrier()
        if not first:
            return None
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp / "policy")
        baseline = trainer.baseline.state_dict() if trainer.baseline is not None else None
        torch.save({"baseline": baseline}, tmp / TRAINER_STATE)
        return _commit(run_dir, tmp, name, state, step, keep, rng)
    finally:
        if first and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def is_sharded(ckpt: str | Path) -> bool:
    """Whether `ckpt` is in the sharded format (a dcp/ directory) rather than the single-file one."""
    return (Path(ckpt) / DCP_DIR / ".metadata").is_file()


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
    """Load the training state into an `SAOTrainer` built on the checkpoint's architecture, in one
    process or sharded (trainer.dist.distributed; `trainer.dist` set), from either format:
        sharded      the fp32 masters and AdamW states from dcp/ (resharded), the baseline
        single-file  the policy's fp32 masters (policy/ holds them rounded to the model dtype; a sharded
                     trainer read them at build), the AdamW states of optimizers.pt (integer ids in
                     parameter order), the baseline. The critic's directory holds its fp32 masters."""
    ckpt = Path(ckpt)
    if is_sharded(ckpt):
        sharded.load_training_state(ckpt / DCP_DIR, trainer)
        baseline = torch.load(ckpt / TRAINER_STATE, weights_only=False)["baseline"]
    else:
        optim = torch.load(ckpt / "optimizers.pt", weights_only=False)
        baseline = optim["baseline"]
        if trainer.dist is not None:
            _restore_sharded_optimizers(trainer, optim)
        else:
            if (ckpt / POLICY_MASTER).is_file():  # a checkpoint from before master weights: policy/ only
                load_model(trainer.policy, str(ckpt / POLICY_MASTER), device=str(trainer.device))
            trainer.policy_optimizer.load_state_dict(optim["policy"])
            if trainer.critic_optimizer is not None and optim["critic"] is not None:
                trainer.critic_optimizer.load_state_dict(optim["critic"])
    if trainer.baseline is not None and baseline is not None:
        trainer.baseline.load_state_dict(baseline)


def _restore_sharded_optimizers(trainer, optim: dict) -> None:
    """optimizers.pt's AdamW states (torch's format: integer ids in parameter order) into sharded
    optimizers; every rank reads the whole file (the old format has no shards)."""
    for module, optimizer, key in ((trainer.policy, trainer.policy_optimizer, "policy"),
                                   (trainer.critic, trainer.critic_optimizer, "critic")):
        if optimizer is None or optim.get(key) is None:
            continue
        names = [n for n, p in module.named_parameters() if p.requires_grad]
        osd = {"state": {names[i]: v for i, v in optim[key]["state"].items()},
               "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in optim[key]["param_groups"]]}
        set_optimizer_state_dict(module, optimizer, osd, options=StateDictOptions(full_state_dict=True))


def restore_rng(ckpt: str | Path) -> None:
    """Set this process's RNG states from the checkpoint's rng.pt (the process that trains, or the driver)."""
    set_rng_state(torch.load(Path(ckpt) / RNG, weights_only=False))
