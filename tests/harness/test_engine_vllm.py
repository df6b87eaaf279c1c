"""The vllm engine's code around vLLM, with a fake ``vllm`` module (no GPU, vllm not installed).

The fake behaves like vLLM 0.33.0 at the boundaries the wrapper crosses: ``collective_rpc``
arguments are serialised as msgspec would (a tensor arrives as a ``[dtype, shape, index]`` list) and
the method runs on worker objects (``SaoWorkerExtension`` with a model) in threads; the prefix-cache
reset returns False while requests hold blocks unless ``reset_running_requests=True`` preempts them;
``pause_generation(mode="keep")`` freezes requests; ``SamplingParams`` rejects T > 2 and raises
0 < T < 0.01 to 0.01. The weights travel through a real gloo group between this process and the
worker threads.
"""
import asyncio
import sys
import threading
import time
import types
from types import SimpleNamespace

import pytest
import torch

from sao_harness.harness.engines.protocol import EngineError, EngineTimeout, SamplingParams
from sao_harness.harness.engines.vllm import (
    SaoWorkerExtension,
    VLLMEngine,
    from_vllm_output,
    to_vllm_sampling,
)


class FakeParams:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class FakeVLLMSamplingParams(FakeParams):
    """vLLM 0.33.0's temperature rules (sampling_params.py: __post_init__ and _verify_args)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        if 0 < self.temperature < 0.01:
            self.temperature = 0.01
        if self.temperature > 2.0:
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature}.")


def msgspec_roundtrip(obj, tensors):
    """What an object looks like after vLLM's msgpack encode + untyped decode."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return [str(obj.dtype).removeprefix("torch."), list(obj.shape), len(tensors) - 1]
    if isinstance(obj, (list, tuple)):
        return [msgspec_roundtrip(x, tensors) for x in obj]
    if isinstance(obj, dict):
        return {str(k): msgspec_roundtrip(v, tensors) for k, v in obj.items()}
    if obj is None or isinstance(obj, (str, int, float, bool, bytes)):
        return obj
    raise TypeError(f"Encoding objects of type {type(obj).__name__} is unsupported")


class TinyModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lm_head = torch.nn.Linear(2, 2, bias=False)
        self.embed = torch.nn.Embedding(3, 2)
        torch.nn.init.zeros_(self.lm_head.weight)
        torch.nn.init.zeros_(self.embed.weight)

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        for name, t in weights:
            if name not in params:
                raise KeyError(f"no parameter {name}")
            with torch.no_grad():
                params[name].copy_(t)


class FakeWorker(SaoWorkerExtension):
    def __init__(self, rank):
        self.rank = rank
        self.model_runner = SimpleNamespace(model=TinyModel())


def output(ids, finish=None, stop_reason=None, logprobs=True):
    lps = [{t: SimpleNamespace(logprob=-0.1 * (i + 1), rank=1)} for i, t in enumerate(ids)] if logprobs else None
    comp = SimpleNamespace(token_ids=list(ids), logprobs=lps, finish_reason=finish, stop_reason=stop_reason)
    return SimpleNamespace(outputs=[comp], finished=finish is not None)


class FakeAsyncLLM:
    def __init__(self, args):
        self.args, self.rpcs, self.resets, self.cancelled = args, [], [], 0
        self.workers = [FakeWorker(r) for r in range(args.tensor_parallel_size)]
        self.running, self.paused, self.preempted, self.calls = set(), False, 0, []
        self.generate_error = None

    async def generate(self, prompt, params, request_id):
        if self.generate_error:
            raise self.generate_error
        ids = []
        self.running.add(request_id)
        try:
            for i in range(params.max_tokens):
                await asyncio.sleep(0.01)
                while self.paused:  # mode="keep": frozen between two steps
                    await asyncio.sleep(0.005)
                ids.append(100 + i)
                last = i == params.max_tokens - 1
                yield output(ids, "length" if last else None)
        except (asyncio.CancelledError, GeneratorExit):
            self.cancelled += 1
            raise
        finally:
            self.running.discard(request_id)

    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        tensors = []
        args, kwargs = msgspec_roundtrip(tuple(args), tensors), msgspec_roundtrip(kwargs or {}, tensors)
        self.rpcs.append((method, args, kwargs))
        self.calls.append(method)
        return list(await asyncio.gather(*[asyncio.to_thread(getattr(w, method), *args, **kwargs)
                                           for w in self.workers]))

    async def reset_prefix_cache(self, reset_running_requests=False, reset_connector=False):
        self.calls.append("reset_prefix_cache")
        if reset_running_requests:
            self.preempted += len(self.running)
        ok = reset_running_requests or not self.running  # refused while requests hold blocks
        self.resets.append(ok)
        return ok

    async def pause_generation(self, *, mode="abort", wait_for_inflight_requests=None, clear_cache=True):
        self.calls.append(f"pause:{mode}")
        self.paused = True

    async def resume_generation(self):
        self.calls.append("resume")
        self.paused = False

    def shutdown(self):
        pass


@pytest.fixture
def fake_vllm(monkeypatch):
    vllm = types.ModuleType("vllm")
    inputs = types.ModuleType("vllm.inputs")
    vllm.SamplingParams = FakeVLLMSamplingParams
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


def test_temperature_mapped_to_what_vllm_does():
    def temp(t):
        return to_vllm_sampling(SamplingParams(temperature=t), FakeVLLMSamplingParams).temperature

    assert temp(0.0) == 0.0 and temp(1e-6) == 0.0  # greedy in our rule: greedy in vLLM (not raised to 0.01)
    assert temp(0.01) == 0.01 and temp(2.0) == 2.0 and temp(0.7) == 0.7
    with pytest.raises(EngineError, match="temperature 2.5 "):
        to_vllm_sampling(SamplingParams(temperature=2.5), FakeVLLMSamplingParams)
    with pytest.raises(EngineError, match="temperature 0.005 .*use 0"):
        to_vllm_sampling(SamplingParams(temperature=0.005), FakeVLLMSamplingParams)


def test_output_translation():
    res = from_vllm_output(output([5, 6, 7], "stop", stop_reason="</f"), [0, 0, 1])
    assert res.token_ids == [5, 6, 7] and res.logprobs == pytest.approx([-0.1, -0.2, -0.3])
    assert res.finish_reason == "stop" and res.stop_str == "</f" and res.versions == [0, 0, 1]
    assert from_vllm_output(output([5], "stop", stop_reason=151645), [0]).stop_str is None  # an EOS id
    with pytest.raises(EngineError, match="logprobs"):
        from_vllm_output(output([5], "stop", logprobs=False), [0])
    with pytest.raises(EngineError, match="abort"):
        from_vllm_output(output([5], "abort"), [0])


def test_engine_generate_and_timeout(fake_vllm):
    eng = VLLMEngine("some/model", timeout_s=30)
    try:
        args = eng.llm.args
        assert args.logprobs_mode == "processed_logprobs"
        assert args.worker_extension_cls == "sao_harness.harness.engines.vllm.SaoWorkerExtension"
        res = eng.generate([1, 2, 3], SamplingParams(max_tokens=4))
        assert res.token_ids == [100, 101, 102, 103] and res.finish_reason == "length" and res.versions == [0] * 4
        with pytest.raises(EngineTimeout):
            eng.generate([1], SamplingParams(max_tokens=500), timeout=0.1)
        time.sleep(0.1)
        assert eng.llm.cancelled == 1  # the request was aborted, not left running
    finally:
        eng.close()


@pytest.mark.parametrize("tp", [1, 2])
def test_weight_update_mid_request_crosses_the_rpc_as_plain_values(fake_vllm, tp):
    eng = VLLMEngine("some/model", timeout_s=30, tensor_parallel_size=tp)
    try:
        box = {}
        t = threading.Thread(target=lambda: box.setdefault("r", eng.generate([1], SamplingParams(max_tokens=30))))
        t.start()
        time.sleep(0.1)
        new = {"lm_head.weight": torch.arange(4.0).reshape(2, 2), "embed.weight": torch.full((3, 2), 0.5).bfloat16()}
        eng.update_weights(3, new)
        t.join(timeout=30)
        versions = box["r"].versions
        assert set(versions) == {0, 3} and versions == sorted(versions)
        for w in eng.llm.workers:  # every tensor-parallel worker got every tensor
            params = dict(w.model_runner.model.named_parameters())
            assert torch.equal(params["lm_head.weight"], new["lm_head.weight"])
            assert torch.equal(params["embed.weight"], new["embed.weight"].float())
        buckets = [args[0] for method, args, _ in eng.llm.rpcs if method == "sao_receive_bucket"]
        assert len(buckets) == 1  # both tensors fit one bucket (bucket_bytes): its plan crossed, as plain values
        names, dtypes, shapes = ([item[i] for item in buckets[0]["items"]] for i in range(3))
        assert names == ["lm_head.weight", "embed.weight"]
        assert dtypes == ["float32", "bfloat16"] and shapes == [[2, 2], [3, 2]]
        # frozen, loaded bucket by bucket, counted, the running request's KV dropped (checked), resumed
        assert eng.llm.calls[-6:] == ["pause:keep", "sao_begin_update", "sao_receive_bucket", "sao_finish_update",
                                      "reset_prefix_cache", "resume"]
        assert eng.llm.resets == [True] and eng.llm.preempted == 1
        assert eng.version == 3 and eng.health()["version"] == 3

        eng.update_weights(4, {"lm_head.weight": torch.ones(2, 2)})  # the group is reused
        assert [c for c in eng.llm.calls if c == "sao_join_weight_sync"] == ["sao_join_weight_sync"]
        assert torch.equal(eng.llm.workers[0].model_runner.model.lm_head.weight, torch.ones(2, 2))
        eng.update_weights(5, {})  # resumed from a checkpoint: only the version
        assert eng.version == 5 and eng.llm.rpcs[-1][0] == "sao_finish_update" and len(eng.llm.rpcs) == 7
    finally:
        eng.close()


def test_a_reset_that_did_not_happen_is_an_error(fake_vllm):
    eng = VLLMEngine("some/model", timeout_s=30)
    try:
        async def refuse(reset_running_requests=False, reset_connector=False):
            return False

        eng.llm.reset_prefix_cache = refuse
        with pytest.raises(EngineError, match="prefix cache was not reset"):
            eng.update_weights(2, {"lm_head.weight": torch.ones(2, 2)})
        assert eng.version == 0 and eng.llm.paused is False  # resumed all the same
    finally:
        eng.close()


def test_worker_failure_is_an_engine_error_and_the_group_recovers(fake_vllm):
    eng = VLLMEngine("some/model", timeout_s=30)
    try:
        with pytest.raises(EngineError, match="no parameter nope"):
            eng.update_weights(2, {"nope": torch.ones(1), "lm_head.weight": torch.ones(2, 2)})
        assert eng.version == 0 and eng.llm.paused is False
        eng.update_weights(3, {"lm_head.weight": torch.full((2, 2), 2.0)})
        assert torch.equal(eng.llm.workers[0].model_runner.model.lm_head.weight, torch.full((2, 2), 2.0))
    finally:
        eng.close()


def test_engine_errors_are_wrapped(fake_vllm):
    eng = VLLMEngine("some/model", timeout_s=30)
    try:
        with pytest.raises(EngineError, match="temperature 3 "):
            eng.generate([1], SamplingParams(temperature=3.0, max_tokens=2))
        eng.llm.generate_error = RuntimeError("EngineDeadError")
        with pytest.raises(EngineError, match="EngineDeadError"):
            eng.generate([1], SamplingParams(max_tokens=2))
    finally:
        eng.close()


def test_missing_vllm_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(EngineError, match="needs vLLM: on GPUs .*make test-vllm"):
        VLLMEngine("m")


class CountingModel(TinyModel):
    """A model whose load_weights says what it loaded (as vLLM's do): the engine counts the update."""

    def load_weights(self, weights):
        weights = list(weights)
        super().load_weights(weights)
        return {name for name, _ in weights}


def test_an_incomplete_update_fails_and_the_engine_refuses_until_a_complete_one(fake_vllm):
    eng = VLLMEngine("some/model", timeout_s=30, bucket_bytes=16)  # 16 bytes: one tensor per bucket
    try:
        for w in eng.llm.workers:
            w.model_runner.model = CountingModel()
        with pytest.raises(EngineError, match="left 1 of 2 parameters unloaded"):
            eng.update_weights(2, {"lm_head.weight": torch.ones(2, 2)})
        assert eng.version == 0 and not eng.health()["ok"] and "unloaded" in eng.health()["error"]
        with pytest.raises(EngineError, match="not serving"):
            eng.generate([1], SamplingParams(max_tokens=2))
        eng.update_weights(3, {"lm_head.weight": torch.ones(2, 2), "embed.weight": torch.ones(3, 2)})
        assert eng.version == 3 and eng.health()["ok"]
        assert sum(m == "sao_receive_bucket" for m in eng.llm.calls) == 3  # 1 + 2 buckets of <= 16 bytes
        assert len(eng.generate([1], SamplingParams(max_tokens=2)).token_ids) == 2
    finally:
        eng.close()


def test_engine_args_on_cpu_and_on_gpus():
    from sao_harness.harness.engines.vllm import engine_args

    common = dict(dtype="float32", tensor_parallel_size=1, gpu_memory_utilization=0.5, seed=0, max_model_len=4096)
    args, env = engine_args("m", **common, kv_cache_bytes=3 * 2**30 + 1, cpu=True, vllm_args={"enforce_eager": True})
    assert env == {"VLLM_CPU_KVCACHE_SPACE": "4", "TORCH_COMPILE_DISABLE": "1"}  # GiB, rounded up
    assert args["enable_chunked_prefill"] is False and args["max_num_batched_tokens"] == 4096  # the seed fix
    assert args["enforce_eager"] is True and args["logprobs_mode"] == "processed_logprobs"
    args, env = engine_args("m", **common, kv_cache_bytes=None, cpu=True, vllm_args={"enable_chunked_prefill": True})
    assert env == {"VLLM_CPU_KVCACHE_SPACE": "1"} and args["enable_chunked_prefill"] is True
    args, env = engine_args("m", **common, kv_cache_bytes=2**30, cpu=False, vllm_args={"max_num_seqs": 3})
    assert env == {} and args["kv_cache_memory_bytes"] == 2**30 and args["max_num_seqs"] == 3
    assert "enable_chunked_prefill" not in args


def test_seeds_dropped_only_where_chunked_prefill_would_kill_a_cpu_engine():
    sp = SamplingParams(seed=7)
    assert to_vllm_sampling(sp, FakeParams).seed == 7
    assert to_vllm_sampling(sp, FakeParams, drop_seed=True).seed is None


def test_vllm_args_are_checked_against_the_shipped_field_list():
    from sao_harness.harness.engines.config import VLLMEngineConfig

    assert VLLMEngineConfig(vllm_args={"enforce_eager": True, "max_num_seqs": 4, "kv_cache_dtype": "fp8",
                                       "enable_expert_parallel": True, "hf_overrides": {"rope_scaling": {}}}).vllm_args
    for bad, why in [({"enforce_eagr": True}, "close: enforce_eager"), ({"seed": 1}, "run.seed"),
                     ({"worker_extension_cls": "x"}, "set by the engine")]:
        with pytest.raises(ValueError, match=why):
            VLLMEngineConfig(vllm_args=bad)


def test_fused_experts_split_into_per_expert_checkpoint_names():
    from sao_harness.harness.engines.vllm_weights import to_checkpoint_names

    gate_up = torch.arange(2 * 6 * 3, dtype=torch.float32).reshape(2, 6, 3)  # [E, 2I, H], gate rows first
    down = torch.arange(2 * 3 * 3, dtype=torch.float32).reshape(2, 3, 3)  # [E, H, I]
    sd = {"model.layers.0.mlp.experts.gate_up_proj": gate_up, "model.layers.0.mlp.experts.down_proj": down,
          "model.layers.0.mlp.gate.weight": torch.ones(2, 3)}
    out = dict(to_checkpoint_names(sd, "qwen3_moe"))
    assert torch.equal(out["model.layers.0.mlp.experts.1.gate_proj.weight"], gate_up[1, :3])
    assert torch.equal(out["model.layers.0.mlp.experts.1.up_proj.weight"], gate_up[1, 3:])
    assert torch.equal(out["model.layers.0.mlp.experts.0.down_proj.weight"], down[0])
    assert "model.layers.0.mlp.gate.weight" in out and len(out) == 7
    assert dict(to_checkpoint_names(sd, "llama")).keys() == sd.keys()  # other families: unchanged
