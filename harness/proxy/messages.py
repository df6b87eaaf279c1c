"""OpenAI chat messages in and out of the proxy: request messages normalized for the chat template,
Hermes ``<tool_call>`` replies parsed into OpenAI ``tool_calls``, errors as OpenAI-shaped JSON."""
from __future__ import annotations

import json
import re
import uuid
from typing import Any

_TOOL_CALL = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)


class ProxyError(Exception):
    """An error answered as OpenAI-shaped JSON (``{"error": {"message", "type", "code"}}``) with an HTTP status."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code = status, message, type, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": None, "code": self.code}}


def _flatten(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, str):
                parts.append(p)
            elif isinstance(p, dict) and p.get("type", "text") == "text" and isinstance(p.get("text"), str):
                parts.append(p["text"])
            else:
                raise ProxyError(400, f"{where}: only text content parts are supported")
        return "\n".join(parts)
    raise ProxyError(400, f"{where}: content must be a string or a list of text parts")


def _tool_calls(m: dict, where: str) -> list[dict]:
    calls = m.get("tool_calls") or []
    if not isinstance(calls, list):
        raise ProxyError(400, f"{where}: tool_calls must be a list")
    out = []
    for c in calls:
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ProxyError(400, f"{where}: each tool call needs function.name")
        args = fn.get("arguments", "{}")
        out.append({"id": str(c.get("id", "")), "type": "function",
                    "function": {"name": fn["name"], "arguments": args if isinstance(args, str) else json.dumps(args)}})
    return out


def normalize_message(m: Any, i: int) -> dict:
    """A request message as the chat template expects it: string content, OpenAI tool calls."""
    where = f"messages[{i}]"
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise ProxyError(400, f"{where} must be an object with a string 'role'")
    out = {"role": m["role"], "content": _flatten(m.get("content"), where)}
    if m["role"] == "assistant" and m.get("tool_calls"):
        out["tool_calls"] = _tool_calls(m, where)
    if m["role"] == "tool":
        out["tool_call_id"] = str(m.get("tool_call_id", ""))
        if m.get("name"):
            out["name"] = m["name"]
    return out


def message_key(m: Any, i: int) -> tuple:
    """What must be equal for a client message to count as unchanged (cheap: no template work)."""
    n = normalize_message(m, i)
    calls = tuple((c["id"], c["function"]["name"], c["function"]["arguments"]) for c in n.get("tool_calls", ()))
    return n["role"], n["content"], n.get("tool_call_id"), calls


def is_produced(got: Any, call_ids: tuple) -> bool:
    """Does the client's message stand for an assistant reply with these tool-call ids?"""
    return (isinstance(got, dict) and got.get("role") == "assistant"
            and tuple(c.get("id") if isinstance(c, dict) else None for c in got.get("tool_calls") or ()) == call_ids)


def _is_text(obj: Any) -> bool:
    """Does ``obj`` hold only valid Unicode? JSON can escape a lone surrogate (``"\\ud800"``), which no
    UTF-8 text holds: passed on, it fails whoever encodes it next (this server's response, the agent)."""
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, RecursionError):
        return False
    return True


def _decodes_to_text(arguments: str) -> bool:
    """``_is_text`` of what the agent makes of ``arguments`` given as a string: it decodes them once more."""
    try:
        return _is_text(json.loads(arguments))
    except json.JSONDecodeError:
        return True  # not JSON: the agent reports malformed arguments itself
    except RecursionError:
        return False


def parse_tool_calls(text: str) -> tuple[str | None, list[dict] | None]:
    """Hermes ``<tool_call>{"name", "arguments"}</tool_call>`` blocks -> (content, OpenAI tool_calls);
    any malformed block (bad JSON, no name, unterminated, a lone surrogate anywhere) -> (text, None): the
    whole text is a plain reply."""
    if "<tool_call>" not in text:
        return text, None
    calls = []
    for m in _TOOL_CALL.finditer(text):
        if not m.group(2):
            return text, None  # unterminated block
        try:
            obj = json.loads(m.group(1).strip())
        except (json.JSONDecodeError, RecursionError):  # RecursionError: nested deeper than Python recurses
            return text, None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not _is_text(obj):
            return text, None
        args = obj.get("arguments", {})
        if isinstance(args, str) and not _decodes_to_text(args):
            return text, None
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": obj["name"],
                                   "arguments": (args if isinstance(args, str)
                                                 else json.dumps(args, ensure_ascii=False))}})
    content = _TOOL_CALL.sub("", text).strip()
    return content or None, calls
