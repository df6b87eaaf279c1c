"""Reply parsers: the model's text -> OpenAI ``reasoning_content``, ``content`` and ``tool_calls``.

Named as vLLM names them (``--tool-call-parser``, ``--reasoning-parser``), so a config carries over:

  tool parsers       hermes        <tool_call>{"name": N, "arguments": {...}}</tool_call>   (Qwen2.5, Qwen3)
                     qwen3_coder   <tool_call><function=N><parameter=P>V</parameter></function></tool_call>
                     llama3_json   {"name": N, "parameters": {...}}  (the whole reply; ``<|python_tag|>`` optional)
                     glm45         <tool_call>N<arg_key>P</arg_key><arg_value>V</arg_value></tool_call>
                     (newlines between the parts as each family writes them)
  reasoning parsers  qwen3, glm45  <think>R</think>C -> (R, C); no </think>: all content
                     deepseek_r1   the same, but no </think>: all reasoning (a thought cut short)

A tool parser is ``parse(text, tools) -> (content, calls, attempted)``: ``calls`` None when the reply holds
no well-formed call (then the whole text is the content), ``attempted`` when it tried to call one (counted
as ``tool_parse_errors``). Parameter values of the XML formats are text; they are typed by the tool's
JSON schema as vLLM does (integer, number, boolean, object / array as JSON, null). Any call that does not
decode to valid Unicode is malformed (a lone surrogate breaks whoever encodes it next).
``default_parsers(template_text)`` picks the pair a chat template is written for.

Writers, the other way (scripted policies, the ``expert`` engine): ``TOOL_WRITERS[name](content, calls)`` is
the text a model of that format writes for ``content`` and ``calls`` [(name, arguments)], as its family's
template teaches it, such that the parser of the same name reads back exactly those calls (and the content,
except Llama 3's: a call is the whole reply, so the content is dropped). ``prompt_calls`` writes the one call
of ``proxy.tool_format: prompt``, the text the OpenHands SDK reads (``fn_call_converter``; it strips every
value). A value that holds the format's own closing tag cannot be written (``ValueError``).
"""
from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Callable
from typing import Any

from sao_harness.core.errors import UserError
from sao_harness.harness.proxy.messages import ProxyError, decodes_to_text, is_text

_HERMES = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)
_CODER_CALL = re.compile(r"<tool_call>\s*<function=([^>\n]+)>(.*?)</function>\s*(</tool_call>|$)", re.DOTALL)
_CODER_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)
_GLM_CALL = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)
_GLM_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)

ParseResult = tuple[str | None, list[dict] | None, bool]


_ID_CHARS = string.ascii_letters + string.digits


def _call(name: str, arguments: dict | str) -> dict:
    """An OpenAI tool call; its id is 9 random alphanumerics (the form Mistral's templates require)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    call_id = "".join(secrets.choice(_ID_CHARS) for _ in range(9))
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def _valid(name: Any, arguments: Any) -> bool:
    if not isinstance(name, str) or not name or not is_text(name) or not is_text(arguments):
        return False
    return not isinstance(arguments, str) or decodes_to_text(arguments)


def _schema_types(tools: list | None, name: str) -> dict[str, str]:
    """The JSON-schema ``type`` of each parameter of tool ``name`` (``{}`` if unknown)."""
    for t in tools or ():
        fn = t.get("function", t) if isinstance(t, dict) else {}
        if isinstance(fn, dict) and fn.get("name") == name:
            props = (fn.get("parameters") or {}).get("properties") or {}
            return {k: v["type"] for k, v in props.items() if isinstance(v, dict) and isinstance(v.get("type"), str)}
    return {}


def _typed(value: str, kind: str | None) -> Any:
    """A text parameter value as its schema type says; text that does not convert stays text."""
    if kind in (None, "string"):
        return value
    try:
        if kind == "integer":
            return int(value.strip())
        if kind == "number":
            v = float(value.strip())
            return int(v) if v.is_integer() and "." not in value and "e" not in value.lower() else v
        if kind == "boolean" and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        if kind in ("object", "array", "null"):
            return json.loads(value)
    except (ValueError, RecursionError):
        pass
    return value


def _content_before(text: str, start: int) -> str | None:
    return text[:start].strip() or None


def hermes(text: str, tools: list | None) -> ParseResult:
    """Hermes JSON blocks; any malformed block (bad JSON, no name, unterminated) -> the whole text."""
    if "<tool_call>" not in text:
        return text, None, False
    calls = []
    for m in _HERMES.finditer(text):
        if not m.group(2):
            return text, None, True  # unterminated block
        try:
            obj = json.loads(m.group(1).strip())
        except (json.JSONDecodeError, RecursionError):  # RecursionError: nested deeper than Python recurses
            return text, None, True
        if not isinstance(obj, dict) or not _valid(obj.get("name"), obj.get("arguments", {})):
            return text, None, True
        calls.append(_call(obj["name"], obj.get("arguments", {})))
    return _HERMES.sub("", text).strip() or None, calls, True


def qwen3_coder(text: str, tools: list | None) -> ParseResult:
    """Qwen3-Coder XML calls; the content is the text before the first call."""
    if "<tool_call>" not in text:
        return text, None, False
    calls = []
    for m in _CODER_CALL.finditer(text):
        name = m.group(1).strip()
        types = _schema_types(tools, name)
        args = {k.strip(): _typed(v, types.get(k.strip())) for k, v in _CODER_PARAM.findall(m.group(2))}
        if not _valid(name, args):
            return text, None, True
        calls.append(_call(name, args))
    if not calls:
        return text, None, True
    return _content_before(text, text.index("<tool_call>")), calls, True


def glm45(text: str, tools: list | None) -> ParseResult:
    """GLM-4.5 / 4.6 calls: the name on the first line, then key / value pairs."""
    if "<tool_call>" not in text:
        return text, None, False
    calls = []
    for m in _GLM_CALL.finditer(text):
        if not m.group(2):
            return text, None, True
        body = m.group(1)
        name = body.split("<arg_key>", 1)[0].strip()
        types = _schema_types(tools, name)
        args = {k.strip(): _typed(v, types.get(k.strip(), "object" if v.strip()[:1] in "[{" else None))
                for k, v in _GLM_ARG.findall(body)}
        if not _valid(name, args):
            return text, None, True
        calls.append(_call(name, args))
    return _content_before(text, text.index("<tool_call>")), calls, True


def llama3_json(text: str, tools: list | None) -> ParseResult:
    """Llama 3.1+ JSON calls: the whole reply is one or more ``{"name", "parameters"}`` objects
    (``<|python_tag|>`` first, ``;`` between them, both optional); anything else is plain content."""
    body = text.strip()
    body = body.removeprefix("<|python_tag|>").lstrip()
    if not body.startswith("{"):
        return text, None, False
    decoder, calls, i = json.JSONDecoder(), [], 0
    while i < len(body):
        try:
            obj, i = decoder.raw_decode(body, i)
        except (json.JSONDecodeError, RecursionError):
            return text, None, True
        args = obj.get("parameters", obj.get("arguments", {})) if isinstance(obj, dict) else None
        if not isinstance(args, (dict, str)) or not _valid(obj.get("name"), args):
            return text, None, True
        calls.append(_call(obj["name"], args))
        while i < len(body) and body[i] in " \t\r\n;":
            i += 1
    return None, calls, True


def think(text: str, cut_is_reasoning: bool = False) -> tuple[str | None, str]:
    """``[<think>]R</think>C`` -> (R, C). Without ``</think>``: a reply that opened ``<think>`` (or any
    reply, with ``cut_is_reasoning``) is a thought cut short, (R, ""); otherwise (None, text)."""
    stripped = text.lstrip()
    opened = stripped.startswith("<think>")
    body = stripped[len("<think>"):] if opened else text
    if "</think>" not in body:
        return (body.strip("\n") or None, "") if opened or cut_is_reasoning else (None, text)
    reasoning, content = body.split("</think>", 1)
    return reasoning.strip("\n") or None, content.lstrip("\n")


def parse_tool_calls(text: str) -> tuple[str | None, list[dict] | None]:
    """Hermes blocks -> (content, OpenAI tool_calls); malformed -> (text, None). See ``hermes``."""
    content, calls, _ = hermes(text, None)
    return content, calls


Calls = list[tuple[str, dict]]


def _text_value(value: Any, closing: str) -> str:
    """A parameter value as the XML formats write it: text as is, anything else as JSON."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if closing in text:
        raise ValueError(f"a value holding {closing!r} cannot be written in this tool-call format")
    return text


def _with_content(content: str | None, calls_text: str) -> str:
    return "\n".join(part for part in (content, calls_text) if part)


def write_hermes(content: str | None, calls: Calls) -> str:
    """``<tool_call>\\n{"name": N, "arguments": {...}}\\n</tool_call>`` per call, after the content."""
    return _with_content(content, "\n".join(
        f"<tool_call>\n{json.dumps({'name': n, 'arguments': a}, ensure_ascii=False)}\n</tool_call>"
        for n, a in calls))


def write_qwen3_coder(content: str | None, calls: Calls) -> str:
    """Qwen3-Coder's XML calls (one newline either side of each value, as its template writes them)."""
    return _with_content(content, "\n".join(
        f"<tool_call>\n<function={n}>\n"
        + "".join(f"<parameter={k}>\n{_text_value(v, '</parameter>')}\n</parameter>\n" for k, v in a.items())
        + "</function>\n</tool_call>" for n, a in calls))


def write_glm45(content: str | None, calls: Calls) -> str:
    """GLM-4.5 / 4.6 calls: the name after ``<tool_call>``, then one key / value pair a line."""
    return _with_content(content, "\n".join(
        f"<tool_call>{n}\n"
        + "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{_text_value(v, '</arg_value>')}</arg_value>\n"
                  for k, v in a.items())
        + "</tool_call>" for n, a in calls))


def write_llama3_json(content: str | None, calls: Calls) -> str:
    """Llama 3.1+ JSON calls, ``; `` between them; the whole reply (no content), or the content alone."""
    if not calls:
        return content or ""
    return "; ".join(json.dumps({"name": n, "parameters": a}, ensure_ascii=False) for n, a in calls)


def prompt_calls(content: str | None, calls: Calls) -> str:
    """``proxy.tool_format: prompt``: at most one ``<function=N><parameter=P>V</parameter></function>`` after
    the content, as the OpenHands SDK writes it (``convert_tool_call_to_string``) and reads it back."""
    if len(calls) > 1:
        raise ValueError("the prompt tool format carries one call per reply")
    parts = []
    for n, a in calls:
        parts.append(f"<function={n}>")
        for k, v in a.items():
            text = _text_value(v, "</parameter>")
            if "</function" in text:  # the SDK's stop word
                raise ValueError("a value holding '</function' cannot be written in the prompt tool format")
            sep = "\n" if "\n" in text else ""  # a multi-line value on lines of its own
            parts.append(f"<parameter={k}>{sep}{text}{sep}</parameter>")
        parts.append("</function>")
    return _with_content(content, "\n".join(parts))


TOOL_PARSERS: dict[str, Callable[[str, list | None], ParseResult]] = {
    "hermes": hermes, "qwen3_coder": qwen3_coder, "llama3_json": llama3_json, "glm45": glm45,
}
TOOL_WRITERS: dict[str, Callable[[str | None, Calls], str]] = {
    "hermes": write_hermes, "qwen3_coder": write_qwen3_coder, "llama3_json": write_llama3_json, "glm45": write_glm45,
}
REASONING_PARSERS: dict[str, Callable[[str], tuple[str | None, str]]] = {
    "qwen3": think, "glm45": think, "deepseek_r1": lambda text: think(text, cut_is_reasoning=True),
}


def default_parsers(template_text: str) -> tuple[str | None, str | None]:
    """(tool parser, reasoning parser) for a chat template, from the call format it teaches the model."""
    if "<function=" in template_text and "<parameter=" in template_text:
        tool = "qwen3_coder"
    elif "<arg_key>" in template_text:
        tool = "glm45"
    elif "<tool_call>" in template_text:
        tool = "hermes"
    elif "<|python_tag|>" in template_text or "<|eot_id|>" in template_text:
        tool = "llama3_json"
    else:
        tool = None
    reasoning = ("glm45" if tool == "glm45" else "qwen3") if "</think>" in template_text else None
    return tool, reasoning


def resolve(name: str | None, registry: dict, default: str | None, key: str) -> str | None:
    """The parser in force: ``name`` (``none`` = off), else ``default``; an unknown name is an error."""
    if name is None:
        return default
    if name == "none":
        return None
    if name not in registry:
        raise ValueError(f"{key}: unknown parser {name!r}; known: {', '.join(sorted(registry))}, none")
    return name


def no_tool_parser() -> ProxyError:
    return ProxyError(400, "this request carries tools, but the chat template teaches no tool-call format the proxy "
                      f"knows ({', '.join(sorted(TOOL_PARSERS))}): set proxy.tool_parser, or use "
                      "proxy.tool_format=prompt", "invalid_request_error", "no_tool_parser")


def parsers_from_config(template, proxy_cfg) -> tuple[str | None, str | None]:
    """(tool parser, reasoning parser) names in force: ``proxy.tool_parser`` / ``proxy.reasoning_parser``,
    else the template's defaults (``default_parsers``); an unknown name is a ``UserError``."""
    tool, reasoning = default_parsers(template.source)
    try:
        return (resolve(proxy_cfg.tool_parser, TOOL_PARSERS, tool, "proxy.tool_parser"),
                resolve(proxy_cfg.reasoning_parser, REASONING_PARSERS, reasoning, "proxy.reasoning_parser"))
    except ValueError as e:
        raise UserError(str(e)) from None
