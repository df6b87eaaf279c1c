"""The agent loop without Docker: LLM request settings, nudges, iteration limit, error classification.

The sandbox tools are replaced by none (the agent keeps the SDK's ``finish`` and ``think``); the LLM is
the scripted fake server of ``test_agent_fakellm``.
"""
from __future__ import annotations

import json

import httpx
import pytest

from sao_harness.envs.errors import EngineGone
from sao_harness.harness.agent import AgentSettings, ErrorKind, classify_error, load_sdk, run_agent
from sao_harness.harness.prompts import SWEBENCH_CONDA_ACTIVATE, instruction_for, nudge_text
from sao_harness.harness.trace import Status
from sao_harness.sao.config import load_config
from tests.support.fakellm import FakeLLM, Reply, http_error, prompt_call, text, tool


class NoTools:
    """Stands in for SandboxTools: no terminal / file editor."""

    closed = False

    def tool_specs(self):
        return []

    def close(self):
        self.closed = True


def run(script, *, native=True, base_url=None, **settings):
    with FakeLLM(script) as f:
        tools = NoTools()
        r = run_agent(None, base_url=base_url or f.base_url, instruction="Fix the bug.", episode_id="ep-1",
                      task_id="task-1", settings=AgentSettings(native_tool_calling=native, **settings), tools=tools)
    assert tools.closed
    return r, f


@pytest.fixture(scope="module", autouse=True)
def sdk():
    return load_sdk()


def test_instruction_is_the_official_swebench_prompt():
    text_ = instruction_for("Make `x` {equal} 2.", "abc123")
    assert text_.startswith("I have access to a python code repository in the directory /testbed . ")
    assert "<issue_description>\nMake `x` {equal} 2.\n</issue_description>" in text_
    assert "non-test files in the /testbed directory" in text_
    assert "compare your changes with the base commit abc123." in text_
    assert "   2.1 Follow the readme\n   2.2 Install" in text_ and "conda" not in text_
    conda = instruction_for("p", "abc", activate=SWEBENCH_CONDA_ACTIVATE)
    assert "2.1 Activate the environment by running  \n       source /opt/miniconda3" in conda
    assert "2.4 Iterate and figure out how to run the tests\n\nPhase 3." in conda
    assert nudge_text(0).startswith("Please continue working on the task") and "give up" not in nudge_text(0)
    assert nudge_text(1).endswith('If you want to give up, use the "finish" tool to finish the interaction.\n')


def test_settings_from_config():
    cfg = load_config(None, ["agent.max_iterations=7", "agent.max_nudges=3", "sampling.temperature=0.6",
                             "sampling.top_p=0.95", "sampling.top_k=20", "sampling.max_tokens=333",
                             "proxy.tool_format=prompt"])
    s = AgentSettings.from_config(cfg)
    assert (s.max_iterations, s.max_nudges, s.temperature, s.top_p, s.top_k, s.max_tokens) == (7, 3, 0.6, 0.95, 20, 333)
    assert s.native_tool_calling is False
    assert AgentSettings.from_config(load_config()).native_tool_calling is True


@pytest.mark.parametrize("native", [True, False], ids=["native", "prompt"])
def test_requests_carry_sampling_and_episode_headers(native):
    call = tool if native else prompt_call
    r, f = run([call("think", thought="look around"), call("finish", message="done")], native=native,
               temperature=0.7, top_p=0.9, top_k=20, max_tokens=321)
    assert r.finished and r.finish_message == "done" and r.status == Status.OK
    assert r.iterations == 2 and r.llm_response_ids == ["chatcmpl-fake-1", "chatcmpl-fake-2"]
    for body, headers in zip(f.requests, f.headers):
        assert body["temperature"] == 0.7 and body["top_p"] == 0.9 and body["top_k"] == 20
        assert body["max_completion_tokens"] == 321
        for key in ("reasoning_effort", "prompt_cache_key", "prompt_cache_retention", "thinking"):
            assert key not in body
        assert "cache_control" not in json.dumps(body["messages"])
        assert headers["x-episode-id"] == "ep-1" and headers["x-task-id"] == "task-1"
        if native:
            assert [t["function"]["name"] for t in body["tools"]] == ["finish", "think"]
            assert "stop" not in body
        else:
            assert "tools" not in body and body["stop"] == ["</function"]
    # append-only history: each request's messages extend the previous one's
    a, b = f.requests[0]["messages"], f.requests[1]["messages"]
    assert b[:len(a)] == a


def test_max_iterations_is_truncated_turns():
    r, f = run([tool("think", thought=f"step {i}") for i in range(10)], max_iterations=3)
    assert r.hit_max_iterations and not r.finished and r.error is None
    assert r.iterations == 3 == len(f.requests) and r.status == Status.TRUNCATED_TURNS
    assert r.events["conversation_errors"] == ["MaxIterationsReached"]


def test_no_tool_call_is_nudged_then_ends():
    r, f = run([text("I am not sure what to do.")] * 10, max_nudges=2)
    assert (r.nudges, r.iterations, len(f.requests)) == (2, 3, 3)
    assert not r.finished and not r.hit_max_iterations and r.error is None and r.status == Status.OK
    assert r.events["no_tool_call_replies"] == 3
    last_user = [m for m in f.requests[-1]["messages"] if m["role"] == "user"][-1]
    content = last_user["content"]
    content = content if isinstance(content, str) else "".join(c["text"] for c in content)
    assert content == nudge_text(1)


def test_nudge_then_finish_and_iteration_budget_spans_nudges():
    r, _ = run([text("Done, I think."), tool("finish", message="ok")])
    assert r.finished and r.nudges == 1 and r.iterations == 2
    r, f = run([text("hmm")] * 10, max_nudges=5, max_iterations=3)
    assert r.hit_max_iterations and r.iterations == 3 == len(f.requests) and r.nudges == 2


@pytest.mark.parametrize("script, base_url", [
    ([http_error(500, "engine exploded")], None),
    ([tool("think", thought="a"), http_error(503, "engine restarting")], None),
    ([], "http://127.0.0.1:9/v1"),  # nothing listens: connection refused
], ids=["http500", "http503-mid-episode", "connection-refused"])
def test_llm_failures_are_infra_errors(script, base_url):
    r, _ = run(script, base_url=base_url)
    assert r.error_kind == ErrorKind.INFRA and r.status == Status.INFRA_ERROR and not r.finished
    assert r.error and "LLMServiceUnavailableError" in r.error


def test_context_window_overflow_is_truncated_context():
    r, _ = run([http_error(400, "This model's maximum context length is 8192 tokens. However, your messages "
                                "resulted in 9000 tokens.")])
    assert r.error_kind == ErrorKind.CONTEXT and r.status == Status.TRUNCATED_CONTEXT


@pytest.mark.parametrize("native", [True, False], ids=["native", "prompt"])
def test_malformed_tool_calls_are_shown_to_the_agent(native):
    if native:
        script = [tool("no_such_tool", x=1), Reply(tool_calls=[("think", {"nope": 1})]), tool("finish", message="m")]
    else:
        script = [text("<function=think>\n<parameter=thought>unclosed"), prompt_call("no_such_tool", a="b"),
                  prompt_call("finish", message="m")]
    r, f = run(script, native=native)
    assert r.finished and r.error is None and r.iterations == 3 == len(f.requests)


def test_stuck_detection_is_reported():
    r, _ = run([tool("think", thought="same")] * 10, max_iterations=8)
    assert r.stuck and not r.finished and r.status == Status.OK
    r, _ = run([tool("think", thought="same")] * 5, max_iterations=5, stuck_detection=False)
    assert not r.stuck and r.hit_max_iterations


def test_classify_error(sdk):
    from sao_harness.harness.tools import SandboxUnavailable  # lazy: imports the openhands SDK

    llm_exc = sdk["llm_exc"]
    wrap = sdk["ConversationRunError"]
    assert classify_error(SandboxUnavailable("gone")) == ErrorKind.INFRA
    assert classify_error(llm_exc.LLMTimeoutError("slow")) == ErrorKind.INFRA
    assert classify_error(llm_exc.LLMContextWindowExceedError("long")) == ErrorKind.CONTEXT
    assert classify_error(RuntimeError("sdk bug")) == ErrorKind.AGENT
    assert classify_error(EngineGone("engine socket gone")) == ErrorKind.INFRA
    assert classify_error(httpx.ConnectError("refused")) == ErrorKind.INFRA
    try:
        try:
            raise SandboxUnavailable("container removed")
        except SandboxUnavailable as inner:
            raise wrap("conv-1", inner) from inner
    except wrap as e:
        assert classify_error(e) == ErrorKind.INFRA
