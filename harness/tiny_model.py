"""A tiny model of the paper's family (Qwen3-MoE), built locally: no model hub.

``build_tiny_model(out_dir, seed)`` writes, deterministically from ``seed``:
- a byte-level BPE tokenizer (``tokenizers``) trained on Python standard-library source text, with
  Qwen's special tokens and a Qwen-style chat template (system / user / assistant / tool messages,
  Hermes ``<tool_call>`` blocks, a tools section in the system turn, a generation prompt);
- a ``Qwen3MoeForCausalLM`` with random weights: attention + MoE layers, so the frozen-attention
  critic is exercised exactly as on Qwen3-30B-A3B.
The directory loads offline with ``AutoTokenizer`` / ``AutoModelForCausalLM.from_pretrained``.
``ensure_tiny_model(cache_dir, seed)`` builds it once per recipe into a cache directory.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import sysconfig
from pathlib import Path

from sao_harness.core.files import atomic_dir

RECIPE_VERSION = 1
VOCAB_SIZE = 4096
SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>",
]
MODEL_SHAPE = dict(
    hidden_size=64, intermediate_size=128, moe_intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
    num_experts_per_tok=2, decoder_sparse_step=1, max_position_embeddings=262_144,
    rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
)
# Standard-library modules whose source trains the tokenizer: code, prose in docstrings, shell-ish text.
CORPUS_MODULES = [
    "argparse.py", "textwrap.py", "difflib.py", "shlex.py", "string.py", "subprocess.py",
    "dataclasses.py", "json/decoder.py", "json/encoder.py", "unittest/case.py", "logging/__init__.py",
    "configparser.py", "tempfile.py", "shutil.py", "ast.py", "inspect.py",
]

# Qwen2.5-style template (Hermes tool calls). Content is a string; the proxy flattens content parts.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- else %}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) "
    "or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}{{- '\", \"arguments\": ' }}"
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}"
    "{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def corpus_files() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [stdlib / m for m in CORPUS_MODULES if (stdlib / m).is_file()]


def recipe_hash(seed: int) -> str:
    h = hashlib.sha256(json.dumps({"v": RECIPE_VERSION, "seed": seed, "vocab": VOCAB_SIZE, "shape": MODEL_SHAPE,
                                   "special": SPECIAL_TOKENS, "template": CHAT_TEMPLATE}, sort_keys=True).encode())
    for f in corpus_files():
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def build_tokenizer(out_dir: Path):
    """Byte-level BPE trained on ``corpus_files()``; saved as a transformers fast tokenizer."""
    # lazy: tokenizers / transformers are heavy
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    texts = [f.read_text(encoding="utf-8", errors="replace") for f in corpus_files()]
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token=None,
        additional_special_tokens=SPECIAL_TOKENS[1:], clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = MODEL_SHAPE["max_position_embeddings"]
    fast.save_pretrained(out_dir)
    return fast


def build_tiny_model(out_dir: str | Path, seed: int = 0) -> Path:
    """Write tokenizer + randomly initialised Qwen3-MoE model to ``out_dir``; same seed, same bytes."""
    # lazy: torch / transformers are heavy
    import torch
    from transformers import GenerationConfig, Qwen3MoeConfig, Qwen3MoeForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out_dir)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen3MoeConfig(vocab_size=len(tokenizer), eos_token_id=im_end, pad_token_id=pad,
                            bos_token_id=None, **MODEL_SHAPE)
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen3MoeForCausalLM(config)
    # Re-draw every parameter from our own generator so the weights depend only on the seed.
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * config.initializer_range)
    model.generation_config = GenerationConfig(eos_token_id=[im_end, pad], pad_token_id=pad)
    model.save_pretrained(out_dir, safe_serialization=True)
    (out_dir / "sao_recipe.json").write_text(json.dumps({"recipe": recipe_hash(seed), "seed": seed}) + "\n")
    return out_dir


def ensure_tiny_model(cache_dir: str | Path, seed: int = 0) -> Path:
    """The tiny model for ``seed`` under ``cache_dir``, built once (concurrent callers wait)."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    target = cache_dir / f"tiny-qwen3moe-s{seed}-{recipe_hash(seed)}"
    if (target / "sao_recipe.json").is_file():
        return target
    with open(cache_dir / ".tiny.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "sao_recipe.json").is_file():
            return target
        atomic_dir(target, lambda tmp: build_tiny_model(tmp, seed))
    return target


def resolve_model_path(model_cfg) -> str:
    """``model.path`` from config: "tiny" -> the cached tiny model; else the path / hub id as given."""
    if model_cfg.path == "tiny":
        return str(ensure_tiny_model(model_cfg.cache_dir, model_cfg.tiny_seed))
    return model_cfg.path


def templated_tiny_model(cache_dir: str | Path, name: str, chat_template: str, special_tokens: tuple[str, ...] = (),
                         eos_token: str | None = None, bos_token: str | None = None,
                         stop_tokens: tuple[str, ...] = (), seed: int = 0) -> Path:
    """The tiny model speaking another model family's chat format, built once per recipe under ``cache_dir``.

    A copy of ``ensure_tiny_model(cache_dir, seed)`` whose tokenizer carries ``chat_template`` (a published
    template's Jinja text), gains ``special_tokens`` (the model's embeddings grow to match, new rows drawn
    from ``seed``), and has ``eos_token`` / ``bos_token``; ``generation_config.json`` stops on the EOS and
    on ``stop_tokens`` (e.g. Llama 3's ``<|eom_id|>``, GLM's ``<|observation|>``), as the family's own does.
    """
    spec = {"base": recipe_hash(seed), "name": name, "template": chat_template, "special": list(special_tokens),
            "eos": eos_token, "bos": bos_token, "stop": list(stop_tokens)}
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    cache_dir = Path(cache_dir)
    target = cache_dir / f"tiny-{name}-{digest}"
    if (target / "sao_recipe.json").is_file():
        return target
    base = ensure_tiny_model(cache_dir, seed)

    def build(out: Path) -> None:
        # lazy: torch / transformers are heavy
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        tok = AutoTokenizer.from_pretrained(base)
        new = [t for t in special_tokens if t not in tok.get_vocab()]
        if new:
            tok.add_special_tokens({"additional_special_tokens": new}, replace_extra_special_tokens=False)
        if eos_token:
            tok.eos_token = eos_token
        if bos_token:
            tok.bos_token = bos_token
        tok.chat_template = chat_template
        tok.save_pretrained(out)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_pretrained(base)
            model.resize_token_embeddings(len(tok), mean_resizing=False)
        stops = [tok.convert_tokens_to_ids(t) for t in (tok.eos_token, *stop_tokens)]
        model.config.eos_token_id = stops[0]
        model.generation_config = GenerationConfig(eos_token_id=stops, pad_token_id=tok.pad_token_id)
        model.save_pretrained(out, safe_serialization=True)
        (out / "sao_recipe.json").write_text(json.dumps({"recipe": digest, "seed": seed, "family": name}) + "\n")

    with open(cache_dir / ".tiny.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "sao_recipe.json").is_file():
            atomic_dir(target, build)
    return target
