"""The proxy's continuation against every published template in fixtures/templates/ (and more/), at the
text level on the tiny tokenizer: after each reply of a tool-calling conversation, the observation the
proxy renders (``ChatTemplate.after_reply``) is exactly how the template itself ends its full render of
the conversation (the reply as assistant content + tool calls): one tool result, two consecutive ones,
and a user turn after a plain reply. Templates with no tool role are refused with a reason instead."""
import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from sao_harness.harness.proxy import TemplateError
from sao_harness.harness.proxy.template import ChatTemplate
from sao_harness.harness.tiny_model import ensure_tiny_model

FIXTURES = Path(__file__).parent / "fixtures" / "templates"
REPO = Path(__file__).resolve().parents[2]
TEMPLATES = sorted([*FIXTURES.glob("*.jinja"), *(FIXTURES / "more").glob("*.jinja")])
NO_TOOL_ROLE = {"google-gemma-2-2b-it.jinja": "roles must alternate",
                "microsoft-Phi-3.5-mini-instruct.jinja": "does not appear after the turn"}
STOPS = {"openai-gpt-oss-120b.jinja": ["<|call|>", "<|return|>"]}  # stop tokens outside the tiny vocabulary
TOOLS = [{"type": "function", "function": {"name": "terminal", "description": "Run a command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
SYSTEM = {"role": "system", "content": "SYS"}


def call(i):
    return {"id": f"call{i:05d}", "type": "function",
            "function": {"name": "terminal", "arguments": json.dumps({"command": f"ls {i}"})}}


# (reply, what follows it): calls answered by tool results, a plain reply answered by a user turn
TURNS = [
    ({"role": "assistant", "content": "REPLY0", "tool_calls": [call(0)]},
     [{"role": "tool", "tool_call_id": "call00000", "name": "terminal", "content": "OUT0"}]),
    ({"role": "assistant", "content": "REPLY1", "tool_calls": [call(1), call(2)]},
     [{"role": "tool", "tool_call_id": f"call0000{i}", "name": "terminal", "content": f"OUT{i}"} for i in (1, 2)]),
    ({"role": "assistant", "content": "REPLY3"}, [{"role": "user", "content": "NUDGE"}]),
]


@pytest.fixture(scope="module")
def tiny_path():
    return ensure_tiny_model(REPO / ".cache" / "sao", 0)


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_observation_is_how_the_template_ends_the_conversation(path, tiny_path):
    tok = AutoTokenizer.from_pretrained(tiny_path)
    stops = STOPS.get(path.name, [])
    if stops:
        tok.add_special_tokens({"additional_special_tokens": stops}, replace_extra_special_tokens=False)
    if path.name in NO_TOOL_ROLE:
        with pytest.raises(TemplateError, match=NO_TOOL_ROLE[path.name]):
            ChatTemplate(tok, path.read_text()).check_continuable()
        return
    template = ChatTemplate(tok, path.read_text(), eos_ids={tok.eos_token_id, *tok.convert_tokens_to_ids(stops)})
    template.check_continuable(tools=TOOLS)
    history, checked = [SYSTEM, {"role": "user", "content": "TASK"}], 0
    for reply, new in TURNS:
        calls = [(c["id"], c["function"]["name"]) for c in reply.get("tool_calls", [])]
        observation = template.after_reply(SYSTEM, new, TOOLS, [], calls)
        history += [reply, *new]
        try:
            full = template.render(history, TOOLS, True)
        except Exception:  # the template refuses this history itself (Llama 3: one call per turn): no reference
            continue
        assert full.endswith(observation), f"{observation!r} is not how the template ends {full[-300:]!r}"
        assert all(m["content"] in observation for m in new)
        checked += 1
    assert checked >= 1
