"""Several episodes at once: correct, separate traces (hf engine), and as many turns in flight as
rollout workers (a sleeping engine)."""
import threading
import time
from pathlib import Path

import httpx
import pytest
from openai import OpenAI
from transformers import AutoTokenizer

from sao_harness.harness.engines.hf import HFEngine
from sao_harness.harness.engines.sleep import SleepEngine
from sao_harness.harness.proxy import ProxyServer
from sao_harness.harness.tiny_model import ensure_tiny_model
from sao_harness.harness.trace import Status
from sao_harness.sao.config import load_config

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
        assert b.task_id == f"task-{i}" and b.turns == TURNS and b.status == Status.OK and b.breaks == []
        assert [s.kind for s in b.segments] == ["observation", "action"] * TURNS
        assert b.token_ids == a.token_ids  # same seeds: the same episode, batched or alone
        assert b.logp_rollout == pytest.approx(a.logp_rollout, abs=1e-4)


class InFlight(SleepEngine):
    """SleepEngine whose calls wait together, counting the most running at once (``peak``): each waits until
    ``all_in`` calls have run at once or ``hold_s`` after the first call began (a capped proxy never lets all in),
    so no call waits longer than the test needs."""

    def __init__(self, all_in: int, hold_s: float, *args, **kwargs):
        super().__init__(0.0, *args, **kwargs)
        self.all_in, self.hold_s = all_in, hold_s
        self.running = self.peak = 0
        self.deadline: float | None = None
        self._gate = threading.Condition()

    def generate(self, prompt_ids, sampling, timeout=None):
        with self._gate:
            self.running += 1
            self.peak = max(self.peak, self.running)
            self.deadline = self.deadline or time.monotonic() + self.hold_s
            self._gate.notify_all()
            while self.peak < self.all_in and (left := self.deadline - time.monotonic()) > 0:
                self._gate.wait(left)
        try:
            return super().generate(prompt_ids, sampling, timeout)
        finally:
            with self._gate:
                self.running -= 1


def peak_turns_in_flight(workers: int, episodes: int, hold_s: float) -> int:
    """``episodes`` concurrent one-turn episodes (one HTTP connection each) through a proxy configured for
    ``rollout.workers=workers`` in front of an engine whose calls wait until all ``episodes`` are in or
    ``hold_s`` after the first began (``InFlight``): the most engine calls in flight at once."""
    cfg = load_config(None, [f"model.cache_dir={REPO / '.cache' / 'sao'}", f"rollout.workers={workers}"])
    tok = AutoTokenizer.from_pretrained(ensure_tiny_model(cfg.model.cache_dir, 0))
    engine = InFlight(episodes, hold_s, len(tok), tok.convert_tokens_to_ids("<|im_end|>"))
    proxy = ProxyServer(engine, tok, cfg, model_name="tiny")
    url = proxy.start() + "/chat/completions"
    codes: list[int] = []
    client = httpx.Client(timeout=60, limits=httpx.Limits(max_connections=episodes))  # one connection each
    ready = threading.Barrier(episodes)

    def one(i: int) -> None:
        ready.wait(timeout=60)  # the requests go out together
        r = client.post(url, headers={"X-Episode-Id": f"ep-{i}"},
                        json={"messages": [{"role": "user", "content": f"task {i}"}], "max_tokens": 4})
        codes.append(r.status_code)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(episodes)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        client.close()
        proxy.stop()
    assert codes == [200] * episodes and engine.calls == episodes
    return engine.peak


def test_turns_in_flight_follow_rollout_workers():
    """64 workers (the flagship config): all 64 episodes' turns are in the engine at once (anyio's
    default 40-thread pool, which served them before, capped this at 40); fewer workers than the
    floor keep its 40 threads; more episodes than workers wait for a thread (bounded, not unbounded)."""
    assert peak_turns_in_flight(workers=64, episodes=64, hold_s=30) == 64  # released once all 64 are in
    # capped: the hold (one turn before: 2 s, time for every admitted call on a loaded machine) lets in every
    # call the cap admits, and no more come
    assert peak_turns_in_flight(workers=2, episodes=48, hold_s=2.0) == 40
    assert peak_turns_in_flight(workers=50, episodes=64, hold_s=2.0) == 50
