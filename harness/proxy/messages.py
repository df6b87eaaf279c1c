"""OpenAI chat messages in and out of the proxy: request messages normalized for the chat template
(and for rendering: tool-call arguments as objects), errors as OpenAI-shaped JSON."""
from __future__ import annotations

import json
from typing import Any


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


def is_text(obj: Any) -> bool:
    """Does ``obj`` hold only valid Unicode? JSON can escape a lone surrogate (``"\\ud800"``), which no
    UTF-8 text holds: passed on, it fails whoever encodes it next (this server's response, the agent)."""
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, RecursionError):
        return False
    return True


def decodes_to_text(arguments: str) -> bool:
    """``is_text`` of what the agent makes of ``arguments`` given as a string: it decodes them once more."""
    try:
        return is_text(json.loads(arguments))
    except json.JSONDecodeError:
        return True  # not JSON: the agent reports malformed arguments itself
    except RecursionError:
        return False


def for_template(messages: list[dict]) -> list[dict]:
    """Normalized messages as chat templates expect them: tool-call arguments as objects, as vLLM passes
    them (Qwen3-Coder, GLM and Llama 3.1 iterate over them; a string that is no JSON object stays one)."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                args = c["function"]["arguments"]
                try:
                    parsed = json.loads(args) if isinstance(args, str) else args
                except (json.JSONDecodeError, RecursionError):
                    parsed = args
                calls.append({**c, "function": {**c["function"],
                                                "arguments": parsed if isinstance(parsed, dict) else args}})
            m = {**m, "tool_calls": calls}
        out.append(m)
    return out
