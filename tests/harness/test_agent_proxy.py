"""Integration: the OpenHands agent in a Docker sandbox against the real token-exact proxy.

The engine is the ``scripted`` test double (Hermes ``<tool_call>`` replies in native mode, ``<function=>``
text in prompt mode) with the tiny model's tokenizer. Checks that the SDK's history is append-only
through the proxy (no sequence breaks), that the trace has one action segment per agent turn, and that
the SDK's response ids are the proxy's completion ids.
"""
from __future__ import annotations

import json

import pytest

from sao_harness.harness.agent import AgentSettings, run_agent
from sao_harness.harness.trace import Status
from tests.support.agent import make_repo_sandbox

pytestmark = pytest.mark.docker


def hermes(name, **args):
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def fn(name, **args):
    body = "".join(f"<parameter={k}>{v}</parameter>\n" for k, v in args.items())
    return f"<function={name}>\n{body}</function>"


@pytest.mark.parametrize("native", [True, False], ids=["native", "prompt"])
def test_episode_through_the_token_exact_proxy(engine, tiny_model_dir, native):
    from transformers import AutoTokenizer

    from sao_harness.harness.engines.scripted import ScriptedEngine
    from sao_harness.harness.proxy import ProxyServer
    from sao_harness.sao.config import load_config

    call = hermes if native else fn
    replies = [call("terminal", command="cat a.py"),
               call("file_editor", command="str_replace", path="/testbed/a.py", old_str="x = 1", new_str="x = 3"),
               "Let me double-check." if native else "Let me double-check.",
               call("terminal", command="python3 -c 'import a; print(a.x)'"),
               call("finish", message="done")]
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = load_config(None, ["sampling.max_tokens=4096", "proxy.context_budget=200000"])
    proxy = ProxyServer(ScriptedEngine(tok, replies), tok, cfg, model_name="tiny")
    url = proxy.start()
    sb = make_repo_sandbox(engine)
    try:
        r = run_agent(sb, base_url=url, instruction="Make x equal 3.", episode_id="ep-proxy", task_id="t-proxy",
                      settings=AgentSettings(native_tool_calling=native, temperature=1.0, max_tokens=4096))
        assert r.finished and r.nudges == 1 and r.iterations == 5 and r.status == Status.OK, r
        assert "+x = 3" in sb.diff("HEAD")
        traj = proxy.close_episode("ep-proxy")
        assert traj.breaks == [] and traj.status == Status.OK  # the SDK only ever appended to the history
        assert traj.turns == 5 and sum(s.kind == "action" for s in traj.segments) == 5
        assert traj.metadata["completion_ids"] == r.llm_response_ids
        assert traj.task_id == "t-proxy"
    finally:
        sb.close()
        proxy.stop()
