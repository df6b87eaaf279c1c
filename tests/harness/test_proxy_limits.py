"""The proxy's guards: the request size limit (413), the bearer token (401), the bind rule, the
episode clients (the OpenHands agent, the simulated environment) sending the token, and the context
budget capped at the model's length. Loopback only."""
import http.client
import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlparse

import httpx
import pytest
from openai import OpenAI
from transformers import AutoTokenizer

from sao_harness.core.errors import UserError
from sao_harness.harness.agent import AgentSettings, run_agent
from sao_harness.harness.config import context_budget
from sao_harness.harness.engines.scripted import ScriptedEngine
from sao_harness.harness.episode import EpisodeContext
from sao_harness.harness.episode import _status as episode_status
from sao_harness.harness.proxy import ProxyServer, check_loopback
from sao_harness.harness.testbeds.simulated import chat_episode
from sao_harness.harness.tiny_model import ensure_tiny_model
from sao_harness.harness.trace import Status
from sao_harness.sao.config import load_config

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "sao"
TOKEN = "s3cret-token"
USER = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(ensure_tiny_model(CACHE, 0))


@pytest.fixture
def serve(tok):
    """``serve(*overrides, replies=...) -> (proxy, engine, url, cfg)``, on 127.0.0.1; stopped afterwards."""
    started = []

    def start(*overrides, replies=("ok",) * 4):
        cfg = load_config(None, [f"model.cache_dir={CACHE}", "sampling.max_tokens=8", *overrides])
        engine = ScriptedEngine(tok, list(replies))
        proxy = ProxyServer(engine, tok, cfg, model_name="tiny")
        url = proxy.start(host="127.0.0.1")
        started.append(proxy)
        return proxy, engine, url, cfg

    yield start
    for proxy in started:
        proxy.stop()


def chat(url, episode, api_key="none"):
    c = OpenAI(base_url=url, api_key=api_key, max_retries=0, timeout=60, default_headers={"X-Episode-Id": episode})
    return c.chat.completions.create(model="tiny", messages=USER)


def raw_request(url: str, head: str) -> tuple[int, dict]:
    """Send only a request head (no body) to the proxy at ``url``; its status and JSON answer."""
    port = httpx.URL(url).port
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head.encode())
        data = b""
        while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < _length(data):
            chunk = s.recv(65536)  # today's proxy waits for the declared body: this times out
            if not chunk:
                break
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, json.loads(data.partition(b"\r\n\r\n")[2])


def _length(data: bytes) -> int:
    for line in data.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 1 << 62


def test_a_declared_oversized_body_is_413_without_reading_it(serve):
    proxy, engine, url, _ = serve("proxy.max_request_bytes=1024")
    status, body = raw_request(url, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                    "Content-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n")
    assert status == 413 and body["error"]["code"] == "request_too_large"
    assert "proxy.max_request_bytes" in body["error"]["message"] and "1024" in body["error"]["message"]
    assert engine.calls == 0 and proxy.sessions == {}
    assert chat(url, "small").choices[0].message.content == "ok"  # under the limit: served


def test_a_chunked_oversized_body_is_413(serve):
    _, engine, url, _ = serve("proxy.max_request_bytes=1024")
    payload = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "x" * 20_000}]}).encode()

    def chunks():  # a generator body: sent with Transfer-Encoding: chunked, no Content-Length
        for i in range(0, len(payload), 512):
            yield payload[i:i + 512]

    r = httpx.post(url + "/chat/completions", content=chunks(), headers={"X-Episode-Id": "big"}, timeout=30)
    assert r.status_code == 413 and "max_request_bytes (1024 bytes)" in r.json()["error"]["message"]
    assert engine.calls == 0
    assert chat(url, "small").choices[0].message.content == "ok"  # the server keeps serving


def test_the_token_is_required_on_every_request(serve):
    _, engine, url, _ = serve(f"proxy.token={TOKEN}")
    base = url.removesuffix("/v1")
    for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/models"), ("GET", "/health"),
                         ("POST", "/episodes/x/close")):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN},
                        {"Authorization": f"Basic {TOKEN}"}):
            r = httpx.request(method, base + path, headers=headers, json={"messages": USER}, timeout=10)
            assert r.status_code == 401, (path, headers, r.text)
            assert r.json()["error"]["type"] == "authentication_error"
    assert engine.calls == 0
    r = chat(url, "authed", api_key=TOKEN)  # the OpenAI client sends Authorization: Bearer <api_key>
    assert r.choices[0].message.content == "ok"
    ok = httpx.get(base + "/health", headers={"Authorization": f"bearer {TOKEN}"}, timeout=10)
    assert ok.status_code == 200


def test_the_token_from_the_environment_and_which_wins(serve, monkeypatch):
    monkeypatch.setenv("SAO_PROXY_TOKEN", "from-env")
    _, _, url, cfg = serve()
    assert cfg.proxy.resolved_token() == "from-env"
    assert httpx.get(url + "/models", timeout=10).status_code == 401
    assert chat(url, "env", api_key="from-env").choices[0].message.content == "ok"
    _, _, url2, cfg2 = serve(f"proxy.token={TOKEN}")  # proxy.token wins over $SAO_PROXY_TOKEN
    assert cfg2.proxy.resolved_token() == TOKEN
    assert httpx.get(url2 + "/models", headers={"Authorization": "Bearer from-env"}, timeout=10).status_code == 401
    assert httpx.get(url2 + "/models", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10).status_code == 200


def test_a_routable_host_needs_a_token():
    for host in ("127.0.0.1", "::1", "localhost"):
        check_loopback(host)
        check_loopback(host, TOKEN)
    for host in ("0.0.0.0", "10.1.2.3", "::", "example.com"):
        with pytest.raises(UserError, match="proxy.token") as e:
            check_loopback(host)
        assert repr(host) in str(e.value) and "SAO_PROXY_TOKEN" in str(e.value)
        check_loopback(host, TOKEN)  # with a token: allowed (checked only, never bound here)


def test_sao_serve_names_the_key_for_a_routable_host():
    proc = subprocess.run([sys.executable, "-m", "sao_harness.sao.cli",
                           "serve", "--host", "10.1.2.3"], cwd=REPO, check=False,
                          capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != "SAO_PROXY_TOKEN"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "'10.1.2.3'" in out and "proxy.token" in out, out


class NoTools:
    """Stands in for the sandbox tools: the agent keeps the SDK's ``finish`` and ``think``."""

    def tool_specs(self):
        return []

    def close(self):
        pass


def test_the_agent_sends_the_token(serve):
    finish = '<tool_call>\n{"name": "finish", "arguments": {"message": "done"}}\n</tool_call>'
    proxy, _, url, cfg = serve(f"proxy.token={TOKEN}", "sampling.max_tokens=256", replies=[finish])
    r = run_agent(None, base_url=url, instruction="Say done.", episode_id="ep-tok", task_id="t-tok",
                  settings=AgentSettings.from_config(cfg), tools=NoTools())
    assert r.finished and r.status == Status.OK and r.error is None, r
    assert proxy.close_episode("ep-tok").turns == 1


def test_the_simulated_episode_sends_the_token(serve):
    proxy, _, _, cfg = serve(f"proxy.token={TOKEN}")
    ctx = EpisodeContext(cfg=cfg, proxy=proxy, run_id="run-tok")
    task = SimpleNamespace(instance_id="t-sim")
    traj = chat_episode(task, ctx, "ep-sim", list(USER), 2, lambda turn: f"observation {turn}",
                        lambda traj: 1.0, "simulated")
    assert traj.status == Status.OK and traj.turns == 2 and Status.INFRA_ERROR not in traj.metadata, traj.metadata


# --- the context budget: proxy.context_budget, capped at the model's length -----------------------

def short_model(tmp_path, max_len: int) -> Path:
    """A model directory whose config is the tiny model's with ``max_position_embeddings = max_len``."""
    config = json.loads((ensure_tiny_model(CACHE, 0) / "config.json").read_text())
    out = tmp_path / f"model-{max_len}"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(config | {"max_position_embeddings": max_len}))
    return out


def test_the_context_budget_is_the_smaller_of_the_config_and_the_models_length(tmp_path, tok, caplog):
    def budget(*overrides):
        return context_budget(load_config(None, [f"model.cache_dir={CACHE}", *overrides]))

    tiny = budget()
    assert (tiny.tokens, tiny.source, tiny.model_max, tiny.warning) == (131_072, "proxy.context_budget", 262_144, None)
    assert budget("proxy.context_budget=300000").tokens == 262_144  # the tiny model's max_position_embeddings
    short = short_model(tmp_path, 64)
    b = budget(f"model.path={short}")
    assert (b.tokens, b.source) == (64, f"max_position_embeddings of {short}")
    assert budget(f"model.path={short}", "proxy.context_budget=16").tokens == 16
    b = budget(f"model.path={short}", "engine.max_model_len=32")  # what the engine serves wins over the config
    assert (b.tokens, b.source) == (32, "engine.max_model_len")
    missing = budget("model.path=nobody/not-a-cached-model")  # unreadable: the configured budget, and why
    assert (missing.tokens, missing.source, missing.model_max) == (131_072, "proxy.context_budget", None)
    assert "'nobody/not-a-cached-model' could not be read" in missing.warning
    assert "could not be read" in missing.describe()
    cfg = load_config(None, [f"model.cache_dir={CACHE}", "model.path=nobody/not-a-cached-model"])
    with caplog.at_level(logging.WARNING, logger="sao_harness.harness.proxy.server"):
        proxy = ProxyServer(ScriptedEngine(tok), tok, cfg)  # the proxy says so too
    assert proxy.context_budget == 131_072 and "not-a-cached-model' could not be read" in caplog.text


def test_a_prompt_over_the_models_length_ends_truncated_context_and_is_rewarded(serve, tmp_path):
    """proxy.context_budget (131072) is far above the model's length (200): the proxy enforces the
    model's. A turn whose prompt passes it is a 400 context_length_exceeded naming the limit; the
    episode ends truncated_context and is rewarded like any other end, never an infra_error (before,
    the prompt went to the engine, past the model's positions)."""
    proxy, engine, url, cfg = serve(f"model.path={short_model(tmp_path, 200)}", replies=["ok"] * 4)
    assert proxy.context_budget == 200 and cfg.proxy.context_budget == 131_072
    long_prompt = [{"role": "user", "content": "word " * 300}]
    r = httpx.post(url + "/chat/completions", headers={"X-Episode-Id": "long"}, json={"messages": long_prompt},
                   timeout=30)
    error = r.json()["error"]
    assert r.status_code == 400 and error["code"] == "context_length_exceeded", r.text
    assert "max_position_embeddings" in error["message"] and "is 200" in error["message"]
    assert engine.calls == 0 and proxy.close_episode("long").status == Status.TRUNCATED_CONTEXT

    ctx = EpisodeContext(cfg=cfg, proxy=proxy, run_id="run-ctx")
    traj = chat_episode(SimpleNamespace(instance_id="t-ctx"), ctx, "ep-ctx", list(USER), 3,
                        lambda turn: "observation " * 300, lambda traj: 1.0, "simulated")
    assert (traj.status, traj.reward, traj.turns) == (Status.TRUNCATED_CONTEXT, 1.0, 1), traj.metadata
    assert Status.INFRA_ERROR not in traj.metadata and "over the budget 200" in traj.metadata["errors"][0]


def test_the_agent_over_the_models_length_ends_truncated_context(serve, tmp_path):
    """The OpenHands agent's first prompt (its system prompt and tools) is longer than a 512-token
    model: the agent ends truncated_context, and the episode's status (what grading follows) too."""
    proxy, _, url, cfg = serve(f"model.path={short_model(tmp_path, 512)}", "sampling.max_tokens=256")
    r = run_agent(None, base_url=url, instruction="Say done.", episode_id="ep-short", task_id="t-short",
                  settings=AgentSettings.from_config(cfg), tools=NoTools())
    assert r.status == Status.TRUNCATED_CONTEXT and "context_length_exceeded" in (r.error or ""), r
    traj = proxy.close_episode("ep-short")
    assert traj.status == Status.TRUNCATED_CONTEXT and episode_status(r, traj, None) == Status.TRUNCATED_CONTEXT


def test_an_idle_connection_outlives_the_clients_keep_alive(serve):
    """A connection idle for longer than httpx's keep-alive expiry (5 s, uvicorn's default timeout too) is still
    open: the client, not the server, drops it, so a request never races the server's close (with the old 5 s
    server timeout the second request below gets no response)."""
    _, _, url, _ = serve()
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request("GET", "/health")
    assert conn.getresponse().read() and conn.sock is not None
    sock = conn.sock
    time.sleep(httpx.Limits().keepalive_expiry + 0.5)  # past a 5 s server timeout too: its timer started first
    conn.request("GET", "/health")  # on the same socket: http.client reconnects only when it has none
    resp = conn.getresponse()
    assert resp.status == 200 and conn.sock is sock
    conn.close()
