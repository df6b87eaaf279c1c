"""Reply parsers by vLLM's names: each format's calls and typed arguments, and what is not a call."""
import json
from types import SimpleNamespace

import pytest

from sao_harness.core.errors import UserError
from sao_harness.harness.proxy.parsers import REASONING_PARSERS, TOOL_PARSERS, default_parsers, parsers_from_config
from sao_harness.harness.tiny_model import CHAT_TEMPLATE

TOOLS = [{"type": "function", "function": {"name": "view", "parameters": {"type": "object", "properties": {
    "path": {"type": "string"}, "line": {"type": "integer"}, "scale": {"type": "number"},
    "all": {"type": "boolean"}, "range": {"type": "array"}}}}}]


def calls(result):
    content, cs, attempted = result
    return content, [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in cs or []], attempted


def test_qwen3_coder_types_parameters_by_the_tool_schema():
    text = ("Let me look.\n<tool_call>\n<function=view>\n<parameter=path>\nsrc/a b.py\n</parameter>\n"
            "<parameter=line>\n12\n</parameter>\n<parameter=scale>\n0.5\n</parameter>\n<parameter=all>\ntrue\n"
            "</parameter>\n<parameter=range>\n[1, 5]\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
            "<function=other>\n<parameter=code>\nx = 1\nprint(x)\n</parameter>\n</function>\n</tool_call>")
    assert calls(TOOL_PARSERS["qwen3_coder"](text, TOOLS)) == ("Let me look.", [
        ("view", {"path": "src/a b.py", "line": 12, "scale": 0.5, "all": True, "range": [1, 5]}),
        ("other", {"code": "x = 1\nprint(x)"})], True)


def test_glm45_reads_name_and_key_value_pairs():
    text = ("\n<tool_call>view\n<arg_key>path</arg_key>\n<arg_value>a.py</arg_value>\n<arg_key>line</arg_key>\n"
            "<arg_value>3</arg_value>\n<arg_key>extra</arg_key>\n<arg_value>{\"k\": [1]}</arg_value>\n</tool_call>")
    assert calls(TOOL_PARSERS["glm45"](text, TOOLS)) == (None, [("view", {"path": "a.py", "line": 3,
                                                                          "extra": {"k": [1]}})], True)


def test_llama3_json_reads_one_or_more_calls_and_nothing_else():
    parse = TOOL_PARSERS["llama3_json"]
    two = '<|python_tag|>{"name": "view", "parameters": {"path": "a"}}; {"name": "view", "arguments": {"line": 2}}'
    assert calls(parse(two, TOOLS)) == (None, [("view", {"path": "a"}), ("view", {"line": 2})], True)
    assert parse("The answer is 4.", TOOLS) == ("The answer is 4.", None, False)
    assert parse('{"name": "view", "parameters": {"path": ', TOOLS)[1:] == (None, True)  # cut: a failed call


@pytest.mark.parametrize("name,text", [
    ("hermes", '<tool_call>\n{"name": "view", "arguments": {"path": "a"}}'),  # unterminated
    ("hermes", '<tool_call>\n{"name": "view", "arguments": {"path": "\\ud800"}}\n</tool_call>'),  # lone surrogate
    ("qwen3_coder", "<tool_call>\n<function=view>\n<parameter=path>\na\n</parameter>\n"),  # no </function>
    ("glm45", "<tool_call>view\n<arg_key>path</arg_key>\n<arg_value>a</arg_value>\n"),  # unterminated
    ("llama3_json", '{"parameters": {"path": "a"}}'),  # no name
])
def test_a_malformed_call_is_the_whole_text_and_counted(name, text):
    assert TOOL_PARSERS[name](text, TOOLS) == (text, None, True)


def test_reasoning_parsers_split_think_blocks():
    qwen3, r1 = REASONING_PARSERS["qwen3"], REASONING_PARSERS["deepseek_r1"]
    assert qwen3("<think>\nplan\n</think>\n\nanswer") == ("plan", "answer")
    assert qwen3("plan\n</think>\n\nanswer") == ("plan", "answer")  # Thinking-2507: <think> was in the prompt
    assert qwen3("no thoughts here") == (None, "no thoughts here")
    assert qwen3("<think>\ncut short") == ("cut short", "")
    assert r1("a thought cut short") == ("a thought cut short", "")


def test_defaults_follow_the_template_and_unknown_names_are_refused():
    assert default_parsers(CHAT_TEMPLATE) == ("hermes", None)
    template = SimpleNamespace(source=CHAT_TEMPLATE)
    assert parsers_from_config(template, SimpleNamespace(tool_parser=None, reasoning_parser="deepseek_r1")) == \
        ("hermes", "deepseek_r1")
    assert parsers_from_config(template, SimpleNamespace(tool_parser="none", reasoning_parser=None)) == (None, None)
    with pytest.raises(UserError, match="proxy.tool_parser: unknown parser 'mistral'"):
        parsers_from_config(template, SimpleNamespace(tool_parser="mistral", reasoning_parser=None))
