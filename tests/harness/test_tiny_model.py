"""The tiny model: Qwen3-MoE + locally trained tokenizer, deterministic, loads offline, Qwen-style template."""
import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from sao_harness.harness.tiny_model import build_tiny_model

TOOLS = [{"type": "function", "function": {"name": "terminal", "description": "Run a shell command",
                                            "parameters": {"type": "object",
                                                           "properties": {"command": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_loads_offline_as_qwen3_moe(tiny_model_dir, tok):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.config.model_type == "qwen3_moe"
    names = [n for n, _ in model.named_parameters()]
    assert any("self_attn.q_proj" in n for n in names) and any("mlp.experts" in n for n in names)
    assert any(n.endswith("mlp.gate.weight") for n in names)  # the router
    assert 1000 <= len(tok) <= 8192 and model.config.vocab_size == len(tok)
    assert tok.eos_token == "<|im_end|>"
    out = model(torch.tensor([tok.encode("def f(x):\n    return x\n")]))
    assert out.logits.shape[-1] == len(tok)


def test_special_tokens_are_single_tokens(tok):
    for t in ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]:
        assert len(tok.encode(t)) == 1, t
    text = "git diff --cached\nprint('héllo ✓')\n"
    assert tok.decode(tok.encode(text)) == text  # byte-level: lossless on any text


def test_chat_template_renders_roles_tool_calls_and_generation_prompt(tok):
    messages = [
        {"role": "system", "content": "You are a coder."},
        {"role": "user", "content": "Fix the bug."},
        {"role": "assistant", "content": "Looking.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "terminal", "arguments": '{"command": "ls"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
        {"role": "tool", "tool_call_id": "c2", "content": "b.py"},
    ]
    text = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are a coder.\n\n# Tools")
    assert json.dumps(TOOLS[0]) in text
    assert ("<|im_start|>assistant\nLooking.\n<tool_call>\n"
            '{"name": "terminal", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>\n') in text
    # consecutive tool results share one user turn
    assert ("<|im_start|>user\n<tool_response>\na.py\n</tool_response>\n"
            "<tool_response>\nb.py\n</tool_response><|im_end|>\n") in text
    assert text.endswith("<|im_start|>assistant\n")
    no_prompt = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=False)
    assert no_prompt.endswith("</tool_response><|im_end|>\n")
    plain = tok.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    assert plain == ("<|im_start|>system\nYou are a coder.<|im_end|>\n<|im_start|>user\nFix the bug.<|im_end|>\n"
                     "<|im_start|>assistant\n")


def test_two_builds_with_one_seed_are_identical(tmp_path):
    a = build_tiny_model(tmp_path / "a", seed=3)
    b = build_tiny_model(tmp_path / "b", seed=3)
    c = build_tiny_model(tmp_path / "c", seed=4)
    assert json.loads((a / "tokenizer.json").read_text()) == json.loads((b / "tokenizer.json").read_text())
    wa, wb, wc = (load_file(p / "model.safetensors") for p in (a, b, c))
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not all(torch.equal(wa[k], wc[k]) for k in wa if "norm" not in k)
