"""Models and checkpoints that no rank ever holds whole (docs/gpu.md, "Memory at scale").

    build   the model on the meta device (no memory), fully_shard (trainer.dist.distributed), to_empty (each
            rank allocates its shard), then every parameter's shard from safetensors files, read one
            full tensor at a time: a rank's peak host memory is its shard plus about one tensor
    names   a parameter is read under its own name, or built as transformers' conversion mapping says
            from the tensors of the hub format, e.g. Qwen3-MoE's fused experts
                gate_up_proj = cat(stack(experts.*.gate_proj), stack(experts.*.up_proj), dim=1)
    save    torch.distributed.checkpoint (DCP): every rank writes its own shards of the fp32 masters and
            of the AdamW states; `write_hf_policy` writes policy/ in the hub format for an engine,
            gathering one tensor at a time (rank 0 streams it into one safetensors file)
    load    DCP reshards on load: a checkpoint written by 4 ranks loads on 2, or unsharded on 1

Every function here that touches a sharded module is a collective: every rank calls it.
"""
from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors import safe_open
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor, distribute_tensor

from sao_harness.trainer.modeling.precision import enable_activation_checkpointing

SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int64: "I64",
                      torch.int32: "I32", torch.bool: "BOOL", torch.uint8: "U8"}


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


# --- the meta build ------------------------------------------------------------------------------

def meta_causal_lm(path: str | Path) -> nn.Module:
    """The causal LM of `path`'s config.json on the meta device, fp32 (the masters' dtype): no weights."""
    from transformers import AutoConfig, AutoModelForCausalLM  # lazy: heavy

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=torch.float32)


def materialize(module: nn.Module, device: torch.device, models: list[nn.Module]) -> None:
    """to_empty on `device` (FSDP2 allocates each rank's shards), then the non-persistent buffers (rotary
    inv_freq) recomputed by transformers' own initialiser of each model in `models` (the PreTrainedModels
    inside `module`): what from_pretrained does for buffers no file holds."""
    module.to_empty(device=device)
    for model in models:
        for sub in model.modules():
            if sub._non_persistent_buffers_set:
                model._init_weights(sub)


class SafetensorsSource:
    """Full tensors by a module's parameter name, from safetensors files, one tensor read at a time.

    `rename` maps the module's name to the files' (a critic's "backbone." <- the policy file's
    "model."); a name the files lack is built by the first of `converters` (transformers'
    WeightConverters of the model) whose target it contains, from the source tensors it names."""

    def __init__(self, path: str | Path, rename: Callable[[str], str] = lambda n: n, converters=()):
        path = Path(path)
        files = [path] if path.is_file() else sorted(path.glob("*.safetensors"))
        if not files:
            raise ValueError(f"{path}: no .safetensors file")
        self.keys: dict[str, Path] = {}
        for file in files:
            with safe_open(file, "pt") as f:
                self.keys.update(dict.fromkeys(f.keys(), file))
        self.path, self.rename = path, rename
        self.converters = [c for c in converters if hasattr(c, "operations")]

    def read(self, key: str) -> torch.Tensor:
        with safe_open(self.keys[key], "pt") as f:
            return f.get_tensor(key)

    def __call__(self, name: str) -> torch.Tensor:
        key = self.rename(name)
        if key in self.keys:
            return self.read(key)
        for conv in self.converters:
            target = next((t for t in conv.target_patterns if t in key), None)
            if target is None:
                continue
            prefix, _, suffix = key.partition(target)
            inputs = {}
            for pattern in conv.source_patterns:  # "mlp.experts.*.gate_proj.weight": * = the expert index
                regex = re.compile(re.escape(prefix + pattern + suffix).replace(r"\*", r"(\d+)") + "$")
                found = sorted((int(m.group(1)), k) for k in self.keys if (m := regex.match(k)))
                if not found:
                    raise ValueError(f"{self.path}: no tensor for {key} (neither it nor {prefix + pattern + suffix})")
                inputs[pattern] = [self.read(k) for _, k in found]
            for op in conv.operations:
                inputs = op.convert(inputs, source_patterns=conv.source_patterns,
                                    target_patterns=conv.target_patterns, full_layer_name=key)
            return next(iter(inputs.values()))
        raise ValueError(f"{self.path}: no tensor {key!r} (for parameter {name!r})")


def conversions(model: nn.Module) -> list:
    """transformers' weight conversions of `model` (hub format -> the model's parameters)."""
    from transformers.conversion_mapping import get_model_conversion_mapping  # lazy: heavy

    return get_model_conversion_mapping(model, add_legacy=False)


@torch.no_grad()
def load_parameters(module: nn.Module, source: Callable[[str], torch.Tensor], skip: tuple[str, ...] = ()) -> None:
    """Every parameter of `module` (but names starting with `skip`) from `source(name)`, a full tensor:
    cast to the parameter's dtype, split as the parameter is sharded, this rank's shard copied in."""

    for name, param in module.named_parameters():
        if name.startswith(skip):
            continue
        full = source(name)
        if tuple(full.shape) != tuple(param.shape):
            raise ValueError(f"parameter {name}: the file's tensor has shape {tuple(full.shape)}, the model's "
                             f"is {tuple(param.shape)} (another architecture?)")
        full = full.to(param.dtype)
        if isinstance(param, DTensor):  # split here, no communication: every rank read the same tensor
            part = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None).to_local()
            param.to_local().copy_(part)
        else:
            param.copy_(full)
        del full


def checkpoint_layers(model: nn.Module, above_tokens: int | None) -> None:
    """Activation checkpointing per decoder layer (transformers', non-reentrant), on in a forward whose
    input_ids hold more than `above_tokens` tokens (None: in every forward). `model` is a transformers
    model (a causal LM or a critic's backbone); its base model's forward switches the layers."""
    from transformers.modeling_layers import GradientCheckpointingLayer  # lazy: heavy

    enable_activation_checkpointing(model)
    if above_tokens is None:
        return
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]

    def switch(_module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        for layer in layers:
            layer.gradient_checkpointing = ids is not None and ids.numel() > above_tokens

    model.base_model.register_forward_pre_hook(switch, with_kwargs=True)


# --- checkpoints: the sharded state (DCP) -------------------------------------------------------

def _prefix(policy: nn.Module) -> str:
    """The policy's names carry "lm." under trainer.dist.distributed.LogprobView; checkpoints store the LM's."""
    return "lm." if hasattr(policy, "lm") else ""


def _modules(trainer) -> list[tuple[str, nn.Module, torch.optim.Optimizer | None, str]]:
    out = [("policy", trainer.policy, trainer.policy_optimizer, _prefix(trainer.policy))]
    if trainer.critic is not None:
        out.append(("critic", trainer.critic, trainer.critic_optimizer, ""))
    return out


def _renamed(sd: dict, fn: Callable[[str], str]) -> dict:
    return {fn(k): v for k, v in sd.items()}


def _optim_renamed(osd: dict, fn: Callable[[str], str]) -> dict:
    return {"state": _renamed(osd.get("state", {}), fn),
            "param_groups": [{**g, "params": [fn(n) for n in g["params"]]} for g in osd.get("param_groups", [])]}


def training_state(trainer, optimizers: set[str] | None = None) -> dict:
    """{"policy", "critic", "policy_optim", "critic_optim"}: the models' and optimizers' state dicts, sharded
    (DTensors) under FSDP, plain in one process; parameter names are the LM's (no "lm." prefix).
    An optimizer is in it if named in `optimizers` ("policy", "critic"), by default if it has a state:
    torch creates a missing state by a zero step, which would count as AdamW's first (a checkpoint
    during trainer.critic_only_steps would shrink the policy's first real step)."""
    state = {}
    for key, module, optimizer, prefix in _modules(trainer):
        strip = lambda n, p=prefix: n.removeprefix(p)
        state[key] = _renamed(get_model_state_dict(module), strip)
        if optimizer is not None and (key in optimizers if optimizers is not None else bool(optimizer.state)):
            state[f"{key}_optim"] = _optim_renamed(get_optimizer_state_dict(module, optimizer), strip)
    return state


def save_training_state(directory: str | Path, trainer) -> None:
    """DCP save of `training_state`: each rank writes its shards (fsynced) into `directory`."""
    dcp.save(training_state(trainer), checkpoint_id=str(directory))


def load_training_state(directory: str | Path, trainer) -> None:
    """DCP load into the trainer's (sharded or plain) models and optimizers, resharded to this world."""
    saved = {k.split(".")[0] for k in dcp.FileSystemReader(str(directory)).read_metadata().state_dict_metadata}
    state = training_state(trainer, {k.removesuffix("_optim") for k in saved if k.endswith("_optim")})
    dcp.load(state, checkpoint_id=str(directory))
    for key, module, optimizer, prefix in _modules(trainer):
        add = lambda n, p=prefix: p + n
        set_model_state_dict(module, _renamed(state[key], add))
        if f"{key}_optim" in state:
            set_optimizer_state_dict(module, optimizer, _optim_renamed(state[f"{key}_optim"], add))


# --- checkpoints: policy/ in the hub format, streamed --------------------------------------------

def _hub_layout(lm: nn.Module, names: list[tuple[str, torch.Tensor]], dtypes: list[torch.dtype]) -> list[list]:
    """For each (name, tensor): [(hub key, shape)] of what it is saved as (transformers' reverse
    conversion, run on meta tensors: shapes only)."""
    from transformers.core_model_loading import revert_weight_conversion  # lazy: heavy

    layout = []
    for (name, t), dtype in zip(names, dtypes):
        meta = {name: torch.empty(tuple(t.shape), dtype=dtype, device="meta")}
        layout.append([(k, tuple(v.shape)) for k, v in revert_weight_conversion(lm, meta).items()])
    return layout


def write_hf_policy(directory: str | Path, lm: nn.Module, dtype: torch.dtype) -> None:
    """policy/config.json and policy/model.safetensors in `dtype`, tensors named as on the hub (what an
    engine loads). The safetensors header is written first (shapes are known), then every tensor is
    gathered (full_tensor: a collective, every rank calls), cast and appended by rank 0: no rank ever
    holds more than one full tensor."""
    from transformers.core_model_loading import revert_weight_conversion  # lazy: heavy

    directory = Path(directory)
    every_name = dict(lm.named_parameters(remove_duplicate=False))  # tied weights: saved once, as the hub does
    names = list(lm.named_parameters()) + [(n, b) for n, b in lm.state_dict(keep_vars=True).items()
                                            if n not in every_name]  # + the persistent buffers
    stored = [dtype if t.is_floating_point() else t.dtype for _, t in names]
    layout = _hub_layout(lm, names, stored)
    header, offset = {}, 0
    for entries, kind in zip(layout, stored):
        for key, shape in entries:
            size = torch.Size(shape).numel() * kind.itemsize
            header[key] = {"dtype": SAFETENSORS_DTYPES[kind], "shape": list(shape),
                           "data_offsets": [offset, offset + size]}
            offset += size
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    out = None
    if rank() == 0:
        directory.mkdir(parents=True, exist_ok=True)
        config = lm.config.to_dict() | {"dtype": str(dtype).removeprefix("torch.")}
        (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        if getattr(lm, "generation_config", None) is not None:
            lm.generation_config.save_pretrained(directory)
        out = open(directory / "model.safetensors", "wb")  # noqa: SIM115 - closed below, after every tensor
        out.write(struct.pack("<Q", len(blob)) + blob)
    try:
        for (name, t), entries in zip(names, layout):
            t = t.detach().to(dtype) if t.is_floating_point() else t.detach()
            full = t.full_tensor() if isinstance(t, DTensor) else t
            if out is None:
                continue
            parts = revert_weight_conversion(lm, {name: full.cpu()})
            for key, _shape in entries:
                out.write(parts[key].contiguous().view(torch.uint8).numpy().tobytes())
    finally:
        if out is not None:
            out.close()
