"""Checks of the scripted fake OpenAI-compatible server (tests/support/fakellm.py)."""
from __future__ import annotations

import json

import httpx
import pytest

from tests.support.fakellm import FakeLLM, http_error, prompt_call, text, tool


def test_fake_llm_scripted_replies_and_records():
    with FakeLLM([tool("terminal", command="ls"), text("a<function=x>b"), http_error(503, "down")]) as f:
        url = f.base_url + "/chat/completions"
        r1 = httpx.post(url, json={"model": "m", "messages": []}, headers={"X-Episode-Id": "e1"}).json()
        call = r1["choices"][0]["message"]["tool_calls"][0]["function"]
        assert call["name"] == "terminal" and json.loads(call["arguments"]) == {"command": "ls"}
        r2 = httpx.post(url, json={"model": "m", "messages": [], "stop": ["<function"]}).json()
        assert r2["choices"][0]["message"]["content"] == "a"
        r3 = httpx.post(url, json={"model": "m", "messages": []})
        assert r3.status_code == 503
        r4 = httpx.post(url, json={"model": "m", "messages": []})
        assert r4.status_code == 500 and "exhausted" in r4.text
    assert len(f.requests) == 4 and f.headers[0]["x-episode-id"] == "e1"


def test_prompt_call_format():
    r = prompt_call("terminal", command="echo hi")
    assert r.content == "<function=terminal>\n<parameter=command>echo hi</parameter>\n</function>"


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q"])
