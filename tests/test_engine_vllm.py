"""The vllm engine's code around vLLM, with a fake ``vllm`` module (no GPU, vllm not installed)."""
import asyncio
import sys
import threading
import time
import types
from types import SimpleNamespace

import pytest
import torch

from harness.engines.protocol import EngineError, EngineTimeout, SamplingParams
from harness.engines.vllm import SaoWorkerExtension, VLLMEngine, from_vllm_output, to_vllm_sampling


class FakeParams:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def output(ids, finish=None, stop_reason=None, logprobs=True):
    lps = [{t: SimpleNamespace(logprob=-0.1 * (i + 1), rank=1)} for i, t in enumerate(ids)] if logprobs else None
    comp = SimpleNamespace(token_ids=list(ids), logprobs=lps, finish_reason=finish, stop_reason=stop_reason)
    return SimpleNamespace(outputs=[comp], finished=finish is not None)


class FakeAsyncLLM:
    def __init__(self, args):
        self.args, self.rpcs, self.resets, self.cancelled = args, [], 0, 0

    async def generate(self, prompt, params, request_id):
        ids = []
        try:
            for i in range(params.max_tokens):
                await asyncio.sleep(0.01)
                ids.append(100 + i)
                last = i == params.max_tokens - 1
                yield output(ids, "length" if last else None)
        except (asyncio.CancelledError, GeneratorExit):
            self.cancelled += 1
            raise

    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.rpcs.append((method, args))
        return [len(args[0])]

    async def reset_prefix_cache(self):
        self.resets += 1
        return True

    def shutdown(self):
        pass


@pytest.fixture
def fake_vllm(monkeypatch):
    vllm = types.ModuleType("vllm")
    inputs = types.ModuleType("vllm.inputs")
    vllm.SamplingParams = FakeParams
    vllm.AsyncEngineArgs = FakeParams
    vllm.AsyncLLMEngine = SimpleNamespace(from_engine_args=FakeAsyncLLM)
    inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    vllm.inputs = inputs
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    return vllm


def test_sampling_params_translation():
    sp = SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_tokens=33, stop=("</function",), seed=4)
    p = to_vllm_sampling(sp, FakeParams)
    assert (p.n, p.temperature, p.top_p, p.top_k, p.max_tokens, p.seed) == (1, 0.7, 0.9, 20, 33, 4)
    assert p.stop == ["</function"] and p.logprobs == 0 and p.skip_special_tokens is False
    assert to_vllm_sampling(SamplingParams(), FakeParams).stop is None


def test_output_translation():
    res = from_vllm_output(output([5, 6, 7], "stop", stop_reason="</f"), [0, 0, 1])
    assert res.token_ids == [5, 6, 7] and res.logprobs == pytest.approx([-0.1, -0.2, -0.3])
    assert res.finish_reason == "stop" and res.stop_str == "</f" and res.versions == [0, 0, 1]
    assert from_vllm_output(output([5], "stop", stop_reason=151645), [0]).stop_str is None  # an EOS id
    with pytest.raises(EngineError, match="logprobs"):
        from_vllm_output(output([5], "stop", logprobs=False), [0])
    with pytest.raises(EngineError, match="abort"):
        from_vllm_output(output([5], "abort"), [0])


def test_engine_generate_update_and_timeout(fake_vllm):
    eng = VLLMEngine("some/model", timeout_s=30)
    try:
        args = eng.llm.args
        assert args.logprobs_mode == "processed_logprobs"
        assert args.worker_extension_cls == "harness.engines.vllm.SaoWorkerExtension"
        res = eng.generate([1, 2, 3], SamplingParams(max_tokens=4))
        assert res.token_ids == [100, 101, 102, 103] and res.finish_reason == "length" and res.versions == [0] * 4

        box = {}
        t = threading.Thread(target=lambda: box.setdefault("r", eng.generate([1], SamplingParams(max_tokens=30))))
        t.start()
        time.sleep(0.1)
        eng.update_weights(3, {"lm_head.weight": torch.ones(2, 2)})
        t.join(timeout=30)
        versions = box["r"].versions
        assert set(versions) == {0, 3} and versions == sorted(versions)
        method, (items,) = eng.llm.rpcs[-1]
        assert method == "sao_load_weights" and items[0][0] == "lm_head.weight" and eng.llm.resets == 1
        assert eng.version == 3 and eng.health()["version"] == 3

        with pytest.raises(EngineTimeout):
            eng.generate([1], SamplingParams(max_tokens=500), timeout=0.1)
        time.sleep(0.1)
        assert eng.llm.cancelled == 1  # the request was aborted, not left running
    finally:
        eng.close()


def test_worker_extension_loads_weights_on_the_model_device():
    seen = {}
    model = torch.nn.Linear(2, 2)
    model.load_weights = lambda weights: seen.update(dict(weights))
    worker = SaoWorkerExtension()
    worker.model_runner = SimpleNamespace(model=model)
    assert worker.sao_load_weights([("weight", torch.zeros(2, 2))]) == 1
    assert seen["weight"].device == model.weight.device


def test_missing_vllm_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(EngineError, match="needs vLLM and a GPU"):
        VLLMEngine("m")
