"""The token-exact proxy with the real openai client: prefix exactness, stored traces, logprobs,
tool-call formats, drift, in-flight weight updates."""
import json
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch
from openai import OpenAI
from transformers import AutoTokenizer

from sao_harness.harness.engines.hf import HFEngine
from sao_harness.harness.engines.sampling import sampling_logprobs
from sao_harness.harness.engines.scripted import ScriptedEngine
from sao_harness.harness.proxy import ProxyServer
from sao_harness.harness.store import TraceStore, read_shard
from sao_harness.harness.tiny_model import ensure_tiny_model
from sao_harness.harness.trace import Status
from sao_harness.sao.config import load_config
from tests.support.proxy import Spy

REPO = Path(__file__).resolve().parents[2]
TOOLS = [{"type": "function", "function": {
    "name": "terminal", "description": "Run a bash command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
SYSTEM = {"role": "system", "content": "You are a coding agent. Fix the bug."}


@pytest.fixture(scope="module")
def model_path():
    return ensure_tiny_model(REPO / ".cache" / "sao", 0)


@pytest.fixture(scope="module")
def tok(model_path):
    return AutoTokenizer.from_pretrained(model_path)


@pytest.fixture(scope="module")
def hf(model_path, tmp_path_factory):
    cfg = load_config(None, ["sampling.max_tokens=12", f"model.cache_dir={REPO / '.cache' / 'sao'}"])
    engine = HFEngine(str(model_path), max_batch=4, timeout_s=120)
    spy = Spy(engine)
    proxy = ProxyServer(spy, engine.tokenizer, cfg, store=TraceStore(tmp_path_factory.mktemp("run")))
    url = proxy.start()
    yield proxy, spy, url
    proxy.stop()
    engine.close()


def client(url, episode):
    return OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120, default_headers={"X-Episode-Id": episode})


def dumped(message):
    """The assistant message as a client re-serializes it (like the OpenHands SDK: content stripped)."""
    m = message.model_dump(exclude_none=True)
    if isinstance(m.get("content"), str):
        m["content"] = m["content"].strip()
    return m


def test_five_turns_are_token_exact_and_traced(hf, tok):
    proxy, spy, url = hf
    c = client(url, "five")
    n0 = len(spy.calls)
    tool = lambda cid, text: {"role": "tool", "tool_call_id": cid, "content": text}
    news = [
        [tool("call_a", "total 4\nsetup.py")],
        [tool("call_b", "ok"), tool("call_c", "def f():\n    return 1")],
        [{"role": "user", "content": "Please continue."}],
        [tool("call_d", "FAILED test_x.py::test_f")],
    ]
    expected_obs = [
        "<|im_start|>user\n<tool_response>\ntotal 4\nsetup.py\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\n<tool_response>\nok\n</tool_response>\n<tool_response>\ndef f():\n    return 1\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\nPlease continue.<|im_end|>\n<|im_start|>assistant\n",
        ("<|im_start|>user\n<tool_response>\nFAILED test_x.py::test_f\n</tool_response><|im_end|>\n"
         "<|im_start|>assistant\n"),
    ]
    msgs = [SYSTEM, {"role": "user", "content": "The test fails."}]
    ids = []
    for turn in range(5):
        r = c.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS, temperature=0.7, top_p=0.9,
                                      max_tokens=12, seed=turn, extra_body={"top_k": 40})
        ids.append(r.id)
        msgs = msgs + [dumped(r.choices[0].message)] + (news[turn] if turn < 4 else [])
    closed = httpx.post(url.removesuffix("/v1") + "/episodes/five/close", timeout=60).json()
    [traj] = read_shard(closed["shard"])
    assert traj.traj_id == closed["traj_id"] and traj.task_id == "five" and traj.status == Status.OK

    calls = spy.calls[n0:]
    assert len(calls) == 5 and traj.turns == 5 and traj.breaks == []
    obs = [s for s in traj.segments if s.kind == "observation"]
    acts = [s for s in traj.segments if s.kind == "action"]
    assert obs[0].token_ids == tok.encode(tok.apply_chat_template(msgs[:2], tools=TOOLS, tokenize=False,
                                                                  add_generation_prompt=True))
    for k in range(1, 5):
        prev_prompt, prev = calls[k - 1]
        prompt = calls[k][0]
        n = len(prev_prompt) + len(prev.token_ids)
        assert prompt[:n] == prev_prompt + prev.token_ids  # never re-rendered
        assert prompt[n:] == obs[k].token_ids  # + only the new observation tokens
        owed = "\n" if prev.token_ids[-1] == tok.eos_token_id else "<|im_end|>\n"
        assert tok.decode(obs[k].token_ids) == owed + expected_obs[k - 1]
    for (_prompt, res), act in zip(calls, acts):  # action tokens are exactly what the engine sampled
        assert act.token_ids == res.token_ids and act.policy_version == res.versions
        assert act.logp_rollout == pytest.approx(res.logprobs, abs=1e-6)
    assert traj.token_ids == calls[-1][0] + calls[-1][1].token_ids

    # recompute: one full forward over the final sequence, the same sampling rule
    with torch.no_grad():
        logits = spy.inner.model(input_ids=torch.tensor([traj.token_ids])).logits[0]
    lp = sampling_logprobs(logits[:-1], 0.7, 0.9, 40)
    pos = torch.tensor([i for i, a in enumerate(traj.is_action) if a])
    recomputed = lp[pos - 1].gather(1, torch.tensor(traj.token_ids)[pos][:, None])[:, 0]
    rollout = torch.tensor([x for x in traj.logp_rollout if x is not None])
    assert (recomputed - rollout).abs().max().item() < 1e-4

    meta = traj.metadata
    assert meta["completion_ids"] == ids and meta["model"] == "tiny" and meta["tokenizer"]
    assert meta["sampling"]["top_k"] == 40 and meta["sampling"]["temperature"] == 0.7
    assert "equal" in meta["drift"] and meta["drift"]["proxy_tokens"] >= traj.num_tokens


def test_weight_update_mid_generation_gives_a_two_version_trace(hf):
    proxy, spy, url = hf
    engine = spy.inner
    orig = engine.model.lm_head.weight.detach().clone()
    box = {}
    c = client(url, "update")
    t = threading.Thread(target=lambda: box.setdefault("r", c.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "go"}], max_tokens=200, seed=11)))
    tokens0 = engine.health()["tokens"]
    t.start()
    deadline = time.monotonic() + 60
    while engine.health()["tokens"] - tokens0 < 10 and time.monotonic() < deadline:
        time.sleep(0.001)
    engine.update_weights(1, {"lm_head.weight": orig * 1.5})
    t.join(timeout=120)
    engine.update_weights(0, {"lm_head.weight": orig})
    traj = proxy.close_episode("update")
    assert traj.versions == [0, 1], f"the update did not land mid-request ({traj.num_action_tokens} tokens)"


@pytest.fixture(scope="module")
def scripted(tok):
    cfg = load_config(None, [f"model.cache_dir={REPO / '.cache' / 'sao'}"])
    engine = ScriptedEngine(tok)
    proxy = ProxyServer(engine, tok, cfg)
    url = proxy.start()
    yield proxy, engine, url
    proxy.stop()


def test_native_tool_calls_are_parsed_and_resent_history_is_not_a_break(scripted, tok):
    proxy, engine, url = scripted
    engine.add_replies(('Let me look.\n<tool_call>\n{"name": "terminal", "arguments": {"command": "ls -la"}}'
                        '\n</tool_call>'),
                       '<tool_call>\n{"name":"terminal","arguments":{"command":"cat setup.py"}}\n</tool_call>',
                       "Done: the bug is fixed.")
    c = client(url, "native")
    msgs = [SYSTEM, {"role": "user", "content": "Fix it."}]
    r = c.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS)
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and m.content == "Let me look."
    [call] = m.tool_calls
    assert call.function.name == "terminal" and json.loads(call.function.arguments) == {"command": "ls -la"}
    # the SDK re-dumps the arguments and may drop the content: still the same history
    resent = {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function",
         "function": {"name": "terminal", "arguments": json.dumps(json.loads(call.function.arguments), indent=1)}}]}
    msgs += [resent, {"role": "tool", "tool_call_id": call.id, "content": "setup.py"}]
    r2 = c.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS)
    call2 = r2.choices[0].message.tool_calls[0]
    msgs += [r2.choices[0].message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call2.id, "content": "x = 1"}]
    r3 = c.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS)
    assert r3.choices[0].finish_reason == "stop" and r3.choices[0].message.tool_calls is None
    traj = proxy.close_episode("native")
    assert traj.breaks == [] and traj.turns == 3 and traj.status == Status.OK
    assert tok.decode(traj.segments[2].token_ids) == (
        "\n<|im_start|>user\n<tool_response>\nsetup.py\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    # drift: a re-render of the history as resent (content dropped, arguments re-dumped) is not what was sampled
    drift = traj.metadata["drift"]
    assert drift["equal"] is False and "Let me look." in drift["proxy_snippet"]
    assert "Let me look." not in drift["render_snippet"]


def test_a_template_exact_episode_has_no_drift(scripted):
    proxy, engine, url = scripted
    engine.add_replies('<tool_call>\n{"name": "terminal", "arguments": {"command": "ls"}}\n</tool_call>', "All done.")
    c = client(url, "nodrift")
    msgs = [SYSTEM, {"role": "user", "content": "Fix it."}]
    r = c.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS)
    msgs += [r.choices[0].message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": r.choices[0].message.tool_calls[0].id, "content": "a.py"}]
    c.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS)
    drift = proxy.close_episode("nodrift").metadata["drift"]
    assert drift["equal"] is True and drift["first_diff"] is None


def test_prompt_based_tools_pass_text_through_and_honour_stop(scripted, tok):
    proxy, engine, url = scripted
    engine.add_replies("I'll list files.\n<function=terminal>\n<parameter=command>ls</parameter>\n</function>\nmore",
                       "ok")
    c = client(url, "prompt")
    msgs = [SYSTEM, {"role": "user", "content": "Fix it."}]
    r = c.chat.completions.create(model="tiny", messages=msgs, stop=["</function"])
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.tool_calls is None
    assert text == "I'll list files.\n<function=terminal>\n<parameter=command>ls</parameter>\n"
    msgs += [{"role": "assistant", "content": text + "</function>"},
             {"role": "user", "content": "EXECUTION RESULT: a.py"}]
    c.chat.completions.create(model="tiny", messages=msgs, stop=["</function"])
    traj = proxy.close_episode("prompt")
    assert traj.breaks == []
    assert tok.decode(traj.segments[1].token_ids).endswith("</function")  # the sampled ids stand
    assert tok.decode(traj.segments[2].token_ids).startswith("<|im_end|>\n<|im_start|>user\nEXECUTION RESULT")


def test_models_and_health(scripted):
    proxy, engine, url = scripted
    models = OpenAI(base_url=url, api_key="none", max_retries=0).models.list()
    assert [m.id for m in models.data] == ["tiny"]
    h = httpx.get(url.removesuffix("/v1") + "/health", timeout=10).json()
    assert h["ok"] is True and h["engine"]["kind"] == "scripted"
