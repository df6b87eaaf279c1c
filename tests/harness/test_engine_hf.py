"""The hf engine on the tiny model: stops, batched concurrency, in-flight weight updates, timeouts."""
import threading
import time
from pathlib import Path

import pytest
import torch

from sao_harness.harness.engines.hf import HFEngine
from sao_harness.harness.engines.protocol import EngineError, EngineTimeout, SamplingParams
from sao_harness.harness.engines.sampling import sampling_logprobs
from sao_harness.harness.tiny_model import ensure_tiny_model

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def engine():
    eng = HFEngine(str(ensure_tiny_model(REPO / ".cache" / "sao", 0)), max_batch=4, timeout_s=60)
    yield eng
    eng.close()


def recompute(engine, prompt, res, sp):
    with torch.no_grad():
        logits = engine.model(input_ids=torch.tensor([prompt + res.token_ids])).logits[0]
    lp = sampling_logprobs(logits[len(prompt) - 1:-1], sp.temperature, sp.top_p, sp.top_k)
    return lp.gather(1, torch.tensor(res.token_ids)[:, None])[:, 0]


def test_generate_length_and_logprobs_match_a_full_forward(engine):
    sp = SamplingParams(temperature=0.7, top_p=0.9, top_k=40, max_tokens=12, seed=3)
    prompt = engine.tokenizer.encode("def main():\n    return")
    res = engine.generate(prompt, sp)
    assert res.finish_reason == "length" and len(res.token_ids) == 12
    assert res.versions == [0] * 12
    assert torch.allclose(recompute(engine, prompt, res, sp), torch.tensor(res.logprobs), atol=1e-4)
    assert engine.generate(prompt, sp).token_ids == res.token_ids  # same seed, same tokens


def test_stops_at_eos_and_at_stop_strings(engine):
    prompt = engine.tokenizer.encode("import os")
    free = engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=10))
    text = engine.tokenizer.decode(free.token_ids)
    stop = text[len(text) // 2:len(text) // 2 + 2]  # a stop string the greedy reply will hit
    res = engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=10, stop=(stop,)))
    assert res.finish_reason == "stop" and res.stop_str == stop
    assert stop in engine.tokenizer.decode(res.token_ids) and len(res.token_ids) <= len(free.token_ids)
    # EOS: treat the greedy reply's third token as an end-of-sequence id
    eos = free.token_ids[2]
    engine.eos_ids.add(eos)
    try:
        res = engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=10))
    finally:
        engine.eos_ids.discard(eos)
    assert res.token_ids == free.token_ids[:free.token_ids.index(eos) + 1] and res.finish_reason == "stop"
    assert engine.tokenizer.eos_token_id in engine.eos_ids


def test_concurrent_requests_are_batched_and_equal_to_solo(engine):
    sp = [SamplingParams(temperature=0.9, max_tokens=n, seed=i) for i, n in enumerate((8, 16, 12, 16, 10))]
    prompts = [list(range(20 + i, 40 + 7 * i)) for i in range(5)]
    solo = [engine.generate(p, s) for p, s in zip(prompts, sp)]
    steps0 = engine.health()["steps"]
    out = [None] * 5
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, engine.generate(prompts[i], sp[i])))
               for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    decode_tokens = sum(len(r.token_ids) - 1 for r in out)  # the first token of each comes from its prefill
    assert engine.health()["steps"] - steps0 < decode_tokens  # several requests advanced per step
    for a, b, p, s in zip(solo, out, prompts, sp):
        assert a.token_ids == b.token_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
        assert torch.allclose(recompute(engine, p, b, s), torch.tensor(b.logprobs), atol=1e-4)


def test_weight_update_mid_generation_gives_two_versions(engine):
    orig = engine.model.lm_head.weight.detach().clone()
    sp = SamplingParams(temperature=1.0, max_tokens=200, seed=11)
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("r", engine.generate(list(range(30, 60)), sp)))
    tokens0 = engine.health()["tokens"]
    t.start()
    deadline = time.monotonic() + 30
    while engine.health()["tokens"] - tokens0 < 10 and time.monotonic() < deadline:
        time.sleep(0.001)
    engine.update_weights(7, {"lm_head.weight": orig * 1.5})
    t.join(timeout=60)
    engine.update_weights(0, {"lm_head.weight": orig})
    res = box["r"]
    assert set(res.versions) == {0, 7}, f"update did not land mid-request ({len(res.token_ids)} tokens)"
    k = res.versions.index(7)
    assert res.versions == [0] * k + [7] * (len(res.versions) - k)


def test_bad_weight_update_is_an_error_and_engine_keeps_serving(engine):
    with pytest.raises(EngineError, match="unknown tensors"):
        engine.update_weights(1, {"no.such.weight": torch.zeros(1)})
    with pytest.raises(EngineError, match="shape"):
        engine.update_weights(1, {"lm_head.weight": torch.zeros(3, 3)})
    assert engine.version == 0
    assert engine.generate([5, 6, 7], SamplingParams(max_tokens=2)).token_ids


def test_timeout_raises_and_cancels(engine):
    with pytest.raises(EngineTimeout, match="did not finish"):
        engine.generate(list(range(10, 60)), SamplingParams(max_tokens=500), timeout=0.05)
    res = engine.generate([5, 6, 7], SamplingParams(max_tokens=3), timeout=30)
    assert len(res.token_ids) == 3
    h = engine.health()
    assert h["ok"] and h["kind"] == "hf"


def test_bad_prompts_are_errors(engine):
    with pytest.raises(EngineError, match="empty prompt"):
        engine.generate([], SamplingParams(max_tokens=2))
    with pytest.raises(EngineError, match="outside"):
        engine.generate([10**9], SamplingParams(max_tokens=2))


def test_a_next_turn_extends_the_cached_prefix_and_matches_a_full_forward(engine):
    """Turn 2's prompt = turn 1's prompt + reply + new tokens: only the new tokens are prefilled (a prefix hit)
    and its logprobs and routes equal a full forward's; after a weight update nothing is reused."""
    sp = SamplingParams(temperature=1.0, top_k=16, max_tokens=5, seed=1)
    first = engine.tokenizer.encode("the first turn of an episode")
    r1 = engine.generate(first, sp)
    second = first + r1.token_ids + engine.tokenizer.encode(" then an observation")
    hits = engine.health()["prefix_hits"]
    replay = SamplingParams(temperature=1.0, top_k=16, max_tokens=5, seed=2, routes_from=len(first) + 4)
    r2 = engine.generate(second, replay)
    assert engine.health()["prefix_hits"] == hits + 1
    assert torch.allclose(recompute(engine, second, r2, sp), torch.tensor(r2.logprobs), atol=1e-4)
    engine._prefix.clear()
    full = engine.generate(second, replay)  # no cache: a full prefill, the same seed
    assert full.token_ids == r2.token_ids and (full.routes == r2.routes).all()
    before = engine.health()["prefix_hits"]
    engine.generate(first, sp)
    engine.update_weights(engine.version + 1, {})
    engine.generate(first + r1.token_ids + [5], sp)
    assert engine.health()["prefix_hits"] == before
