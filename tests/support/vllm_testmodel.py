"""Small test models that vLLM's CPU backend serves (``make test-vllm``, ``bench/bench_vllm.py``,
``bench/mismatch.py``): no model hub.

vLLM's CPU attention supports head sizes 32, 64, 80 and up; the project's tiny model has head_dim 16
(``Unsupported CPU attention configuration: head_dim=16``). These are the tiny model's tokenizer with a
``Qwen3ForCausalLM`` (``dense``) or a ``Qwen3MoeForCausalLM`` (``moe``) of head_dim 32, random weights
drawn from ``seed`` (same seed, same bytes), built once per recipe under ``cache_dir``.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
from pathlib import Path
from typing import Literal

from sao_harness.core.files import atomic_dir
from sao_harness.harness.tiny_model import ensure_tiny_model

RECIPE_VERSION = 2
COMMON = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
              max_position_embeddings=4096, rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
SHAPES = {
    "dense": dict(COMMON, intermediate_size=128),
    "moe": dict(COMMON, intermediate_size=128, moe_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
                decoder_sparse_step=1, norm_topk_prob=True),
}
INIT_STD = 0.4  # far above initializer_range: next-token distributions far from uniform, so that
# logprobs tell two sets of weights apart
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def recipe(family: str, seed: int) -> str:
    spec = {"v": RECIPE_VERSION, "family": family, "seed": seed, "shape": SHAPES[family], "std": INIT_STD}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def build_test_model(out_dir: str | Path, family: Literal["dense", "moe"], seed: int, tokenizer_dir: Path) -> Path:
    """Write the model (random weights from ``seed``) and the tokenizer of ``tokenizer_dir`` to ``out_dir``."""
    import torch  # lazy: heavy
    from transformers import (
        AutoTokenizer,
        GenerationConfig,
        Qwen3Config,
        Qwen3ForCausalLM,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
    )

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, out_dir / name)
    tok = AutoTokenizer.from_pretrained(out_dir)
    im_end, pad = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    cfg_cls, model_cls = (Qwen3Config, Qwen3ForCausalLM) if family == "dense" else (Qwen3MoeConfig, Qwen3MoeForCausalLM)
    config = cfg_cls(vocab_size=len(tok), eos_token_id=im_end, pad_token_id=pad, bos_token_id=None,
                     **SHAPES[family])
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = model_cls(config)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * INIT_STD)
    model.generation_config = GenerationConfig(eos_token_id=[im_end, pad], pad_token_id=pad)
    model.save_pretrained(out_dir, safe_serialization=True)
    (out_dir / "sao_recipe.json").write_text(json.dumps({"recipe": recipe(family, seed), "family": family}) + "\n")
    return out_dir


def ensure_test_model(cache_dir: str | Path, family: Literal["dense", "moe"] = "dense", seed: int = 0) -> Path:
    """The ``family`` test model for ``seed`` under ``cache_dir``, built once (concurrent callers wait)."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    target = cache_dir / f"vllm-test-qwen3{'moe' if family == 'moe' else ''}-hd32-s{seed}-{recipe(family, seed)}"
    if (target / "sao_recipe.json").is_file():
        return target
    tokenizer_dir = ensure_tiny_model(cache_dir, seed)
    with open(cache_dir / ".vllm-test.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "sao_recipe.json").is_file():
            atomic_dir(target, lambda tmp: build_test_model(tmp, family, seed, tokenizer_dir))
    return target
