"""Several episodes at once through the hf engine: correct, separate traces."""
import threading
from pathlib import Path

import pytest
from openai import OpenAI

from harness.engines.hf import HFEngine
from harness.proxy import ProxyServer
from harness.tiny_model import ensure_tiny_model
from sao.config import load_config

REPO = Path(__file__).resolve().parents[2]
EPISODES = 4
TURNS = 3


@pytest.fixture(scope="module")
def server():
    cfg = load_config(None, [f"model.cache_dir={REPO / '.cache' / 'sao'}"])
    engine = HFEngine(str(ensure_tiny_model(cfg.model.cache_dir, 0)), max_batch=EPISODES, timeout_s=120)
    proxy = ProxyServer(engine, engine.tokenizer, cfg)
    url = proxy.start()
    yield proxy, engine, url
    proxy.stop()
    engine.close()


def run_episode(url, episode, i):
    c = OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120,
               default_headers={"X-Episode-Id": episode, "X-Task-Id": f"task-{i}"})
    msgs = [{"role": "system", "content": f"agent {i}"}, {"role": "user", "content": f"task number {i}"}]
    for turn in range(TURNS):
        r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=8 + 2 * i, temperature=0.9,
                                      seed=100 * i + turn)
        msgs += [r.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": f"c{turn}", "content": f"result {i}.{turn}"}]


def test_concurrent_episodes_give_separate_exact_traces(server):
    proxy, engine, url = server
    # reference: each episode alone
    for i in range(EPISODES):
        run_episode(url, f"solo-{i}", i)
    solo = [proxy.close_episode(f"solo-{i}") for i in range(EPISODES)]
    steps0, tokens0 = engine.health()["steps"], engine.health()["tokens"]
    threads = [threading.Thread(target=run_episode, args=(url, f"ep-{i}", i)) for i in range(EPISODES)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    together = [proxy.close_episode(f"ep-{i}") for i in range(EPISODES)]
    h = engine.health()
    assert h["steps"] - steps0 < h["tokens"] - tokens0 - EPISODES * TURNS  # requests shared decode steps
    for i, (a, b) in enumerate(zip(solo, together)):
        assert b.task_id == f"task-{i}" and b.turns == TURNS and b.status == "ok" and b.breaks == []
        assert [s.kind for s in b.segments] == ["observation", "action"] * TURNS
        assert b.token_ids == a.token_ids  # same seeds: the same episode, batched or alone
        assert b.logp_rollout == pytest.approx(a.logp_rollout, abs=1e-4)
