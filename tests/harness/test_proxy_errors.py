"""Bad input to the proxy: each is a clear error or a recorded status, and the server keeps serving."""
from pathlib import Path

import httpx
import openai
import pytest
from openai import OpenAI
from transformers import AutoTokenizer

from sao_harness.core.errors import UserError
from sao_harness.harness.engines.scripted import ScriptedEngine
from sao_harness.harness.proxy import ProxyServer, check_loopback, parse_tool_calls
from sao_harness.harness.store import TraceStore, read_shard
from sao_harness.harness.tiny_model import ensure_tiny_model
from sao_harness.harness.trace import Status
from sao_harness.sao.config import load_config

REPO = Path(__file__).resolve().parents[2]
TOOLS = [{"type": "function", "function": {"name": "terminal", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(ensure_tiny_model(REPO / ".cache" / "sao", 0))


@pytest.fixture(scope="module")
def server(tok, tmp_path_factory):
    cfg = load_config(None, [f"model.cache_dir={REPO / '.cache' / 'sao'}", "proxy.context_budget=1000"])
    engine = ScriptedEngine(tok, timeout_s=0.3)
    proxy = ProxyServer(engine, tok, cfg, store=TraceStore(tmp_path_factory.mktemp("run")))
    url = proxy.start()
    yield proxy, engine, url
    proxy.stop()


def client(url, episode):
    return OpenAI(base_url=url, api_key="none", max_retries=0, timeout=30, default_headers={"X-Episode-Id": episode})


def still_serves(engine, url):
    engine.add_replies("still here")
    r = client(url, "alive").chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == "still here"


def test_malformed_json_body(server):
    proxy, engine, url = server
    r = httpx.post(url + "/chat/completions", content=b'{"messages": [', headers={"X-Episode-Id": "bad"}, timeout=10)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(url + "/chat/completions", json=[1, 2], timeout=10)
    assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]
    for body, needle in (({"messages": []}, "non-empty list"), ({"messages": [{"content": "x"}]}, "role"),
                         ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "text content"),
                         ({"messages": [{"role": "user", "content": "x"}], "stream": True}, "stream"),
                         ({"messages": [{"role": "user", "content": "x"}], "top_p": 5}, "top_p")):
        r = httpx.post(url + "/chat/completions", json=body, timeout=10)
        assert r.status_code == 400 and needle in r.json()["error"]["message"], body
    still_serves(engine, url)


def test_unknown_episode_on_close(server):
    proxy, engine, url = server
    r = httpx.post(url.removesuffix("/v1") + "/episodes/never-seen/close", timeout=10)
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "unknown_episode" and "never-seen" in r.json()["error"]["message"]
    still_serves(engine, url)


def test_rewritten_history_starts_a_new_sequence_and_records_the_break(server, tok):
    proxy, engine, url = server
    engine.add_replies("one", "two", "three")
    c = client(url, "rewrite")
    msgs = [{"role": "user", "content": "first"}]
    r = c.chat.completions.create(model="tiny", messages=msgs)
    msgs += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "second"}]
    c.chat.completions.create(model="tiny", messages=msgs)
    n_before = proxy.session("rewrite").n_tokens
    condensed = [{"role": "user", "content": "summary of earlier events"}, {"role": "user", "content": "go on"}]
    c.chat.completions.create(model="tiny", messages=condensed)
    traj = proxy.close_episode("rewrite")
    assert traj.breaks == [n_before] and traj.turns == 3 and traj.status == Status.OK
    new_seq = traj.token_ids[n_before:]
    rendered = tok.apply_chat_template(condensed, tokenize=False, add_generation_prompt=True)
    assert new_seq[:len(tok.encode(rendered))] == tok.encode(rendered)  # a fresh full render, then the reply
    still_serves(engine, url)


@pytest.mark.parametrize("block", [
    '{"name": "terminal", "arguments": {"command": "ls"',  # bad JSON
    '{"name": "terminal", "arguments": {"command": "echo \\ud800"}}',  # a lone surrogate, as JSON escapes it
    '{"name": "terminal", "arguments": "{\\"command\\": \\"echo \\\\udcff\\"}"}',  # in arguments given as a string
    '{"name": "terminal", "arguments": {"\\udfff": "x"}}',  # in a key
    '{"name": "termin\\ud800al", "arguments": {}}',  # in the name
], ids=["garbled", "surrogate-value", "surrogate-string-arguments", "surrogate-key", "surrogate-name"])
def test_a_malformed_tool_call_is_a_plain_text_reply(server, block):
    """Bad JSON, or JSON that decodes to no valid text: JSON can escape a lone UTF-16 surrogate, which no
    UTF-8 text holds. That made the proxy answer 500 (an infra_error: no reward, a failure left out of
    training), or, passed on, the agent's SDK fail (agent_error). Each is a plain-text reply instead."""
    proxy, engine, url = server
    text = f"<tool_call>\n{block}\n</tool_call>"
    engine.add_replies(text)
    r = client(url, "malformed").chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                                         tools=TOOLS)
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.tool_calls is None
    assert r.choices[0].message.content == text
    assert proxy.close_episode("malformed").metadata["tool_parse_errors"] == 1
    still_serves(engine, url)


@pytest.mark.parametrize("arguments", ["[" * 5000 + "]" * 5000, '"' + "[" * 5000 + "]" * 5000 + '"'],
                         ids=["object", "string"])
def test_a_tool_call_nested_deeper_than_python_recurses_is_a_plain_text_reply(arguments):
    """3,000 brackets are 3,000 tiny-model tokens: json.loads raised RecursionError, a 500 (infra_error)."""
    text = '<tool_call>{"name": "terminal", "arguments": ' + arguments + "}</tool_call>"
    assert parse_tool_calls(text) == (text, None)


def test_prompt_over_budget_is_a_clear_error_and_a_recorded_status(server):
    proxy, engine, url = server
    c = client(url, "long")
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "word " * 1500}])
    assert e.value.code == "context_length_exceeded" and "context budget" in str(e.value)
    closed = httpx.post(url.removesuffix("/v1") + "/episodes/long/close", timeout=10).json()
    assert closed["status"] == read_shard(closed["shard"])[0].status == Status.TRUNCATED_CONTEXT
    # a reply cut by the budget: max_tokens clipped to what is left, finish_reason length
    engine.add_replies("word " * 1500)
    r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5000)
    assert r.choices[0].finish_reason == "length" and r.usage.total_tokens == 1000
    assert proxy.close_episode("long").status == Status.TRUNCATED_CONTEXT
    still_serves(engine, url)


def test_engine_timeout_is_a_504_and_an_infra_error(server):
    proxy, engine, url = server
    engine.add_replies("too slow")
    engine.delay_s = 1.0
    try:
        with pytest.raises(openai.APIStatusError) as e:
            client(url, "slow").chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
    finally:
        engine.delay_s = 0.0
    assert e.value.status_code == 504 and "timeout" in str(e.value)
    traj = proxy.close_episode("slow")
    assert traj.status == Status.INFRA_ERROR and "did not finish" in traj.metadata["errors"][0]
    engine._replies.clear()
    still_serves(engine, url)


def test_engine_error_is_a_503(server):
    proxy, engine, url = server
    engine._replies.clear()
    with pytest.raises(openai.APIStatusError) as e:
        client(url, "empty").chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 503 and "no scripted replies left" in str(e.value)
    still_serves(engine, url)


def test_only_loopback_hosts(server):
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        check_loopback(host)
    for host in ("0.0.0.0", "10.0.0.1", "192.168.1.2", "example.com", "::"):
        with pytest.raises(UserError, match="loopback"):
            check_loopback(host)


def test_in_place_edit_of_old_history(tok):
    """Default: per-turn cost is O(new messages): an in-place edit that keeps the count goes unseen
    (the model keeps seeing what it saw: the trace stays exact). full_history_check=True catches it."""
    cfg = load_config(None, [f"model.cache_dir={REPO / '.cache' / 'sao'}"])
    for full in (False, True):
        engine = ScriptedEngine(tok, ["a", "b", "c", "d"])
        proxy = ProxyServer(engine, tok, cfg, full_history_check=full)
        s = proxy.session("edit")
        msgs = [{"role": "user", "content": "task"}]
        for i in range(3):
            r = s.complete({"messages": msgs})
            msgs += [r["choices"][0]["message"], {"role": "tool", "tool_call_id": f"c{i}", "content": "output " * 20}]
        msgs[2] = {"role": "tool", "tool_call_id": "c0", "content": "[old output omitted]"}  # observation masking
        s.complete({"messages": msgs})
        assert (proxy.close_episode("edit").breaks != []) is full
