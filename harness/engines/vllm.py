"""``vllm`` engine: vLLM's async engine (v1 ``AsyncLLM``) on GPUs. Imported only when selected.

Written against vLLM's public Python API; it needs a GPU and ``pip install vllm`` (the ``gpu`` extra)
and was not run on the CPU machines this project is tested on: the code around the engine (the
translation of our sampling params to ``vllm.SamplingParams``, of vLLM's outputs to our result, the
timeouts, the weight-update call) is tested with a fake ``vllm`` module.

- Engine: ``vllm.AsyncLLMEngine.from_engine_args(vllm.AsyncEngineArgs(...,
  logprobs_mode="processed_logprobs", worker_extension_cls=WORKER_EXTENSION))`` on an asyncio loop
  in a background thread; sync callers wait on that loop with a timeout.
- Logprobs: ``SamplingParams(logprobs=0)`` returns the sampled token's logprob, and
  ``processed_logprobs`` makes it the logprob after temperature, top-k and top-p (the rule of
  ``harness.engines.sampling``; vLLM's default, ``raw_logprobs``, ignores temperature).
- Prompts are token ids: ``TokensPrompt(prompt_token_ids=...)``.
- Weight update: ``collective_rpc("sao_load_weights", args=(items,))`` runs ``SaoWorkerExtension``
  on every worker, which feeds the tensors to ``model_runner.model.load_weights`` (vLLM's own loader
  maps Hugging Face names, fused QKV / experts, tensor-parallel shards). The engine core runs the
  RPC between two scheduler steps, so requests in flight continue on the new weights. The prefix
  cache is then reset (its KV was computed by the old weights). For multi-GPU trainers, vLLM's
  NCCL weight-transfer API (``init_weight_transfer_engine`` / ``update_weights``) is the faster path.
- Versions: a token is tagged with the engine's version when its output chunk reaches this wrapper;
  a token sampled in the last step before an update can be tagged with the new version (at most one
  engine step of slack).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import uuid
from typing import Any

from harness.engines.protocol import Engine, EngineError, EngineTimeout, GenerateResult, SamplingParams

WORKER_EXTENSION = "harness.engines.vllm.SaoWorkerExtension"


class SaoWorkerExtension:
    """Mixed into vLLM's GPU worker (``worker_extension_cls``): methods reachable by ``collective_rpc``."""

    def sao_load_weights(self, items: list[tuple[str, Any]]) -> int:
        model = self.model_runner.model
        device = next(model.parameters()).device
        model.load_weights(weights=[(name, t.to(device)) for name, t in items])
        return len(items)


def to_vllm_sampling(sp: SamplingParams, sampling_params_cls) -> Any:
    """Our ``SamplingParams`` -> ``vllm.SamplingParams`` (one sample, the sampled token's logprob)."""
    return sampling_params_cls(
        n=1,
        temperature=float(sp.temperature),
        top_p=float(sp.top_p),
        top_k=int(sp.top_k),  # 0 = off in both
        max_tokens=int(sp.max_tokens),
        stop=list(sp.stop) or None,
        seed=sp.seed,
        logprobs=0,  # the sampled token's logprob only
        skip_special_tokens=False,
        include_stop_str_in_output=False,
    )


def from_vllm_output(output: Any, versions: list[int]) -> GenerateResult:
    """A finished ``vllm.RequestOutput`` (+ the version of each token) -> ``GenerateResult``."""
    comp = output.outputs[0]
    ids = [int(t) for t in comp.token_ids]
    if comp.logprobs is None or len(comp.logprobs) != len(ids):
        raise EngineError("vllm engine: output without per-token logprobs (SamplingParams.logprobs must be 0)")
    lps = [float(step[tok].logprob) for step, tok in zip(comp.logprobs, ids)]
    if comp.finish_reason not in ("stop", "length"):
        raise EngineError(f"vllm engine: request ended with finish_reason {comp.finish_reason!r}")
    stop_str = comp.stop_reason if isinstance(comp.stop_reason, str) else None
    return GenerateResult(ids, lps, comp.finish_reason, list(versions), stop_str)


class VLLMEngine(Engine):
    kind = "vllm"

    def __init__(self, model_path: str, dtype: str = "bfloat16", tensor_parallel_size: int = 1,
                 gpu_memory_utilization: float = 0.85, timeout_s: float = 600.0, seed: int = 0,
                 max_model_len: int | None = None, startup_timeout_s: float = 1800.0):
        try:
            import vllm
            from vllm.inputs import TokensPrompt
        except ImportError as e:
            raise EngineError("engine.kind=vllm needs vLLM and a GPU (pip install 'sao-harness[gpu]'); "
                              f"import failed: {e}") from None
        self._vllm, self._tokens_prompt = vllm, TokensPrompt
        self.model_path = str(model_path)
        self.timeout_s = timeout_s
        self._version = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-engine", daemon=True)
        self._thread.start()
        args = vllm.AsyncEngineArgs(
            model=self.model_path, dtype=dtype, tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization, seed=seed, max_model_len=max_model_len,
            logprobs_mode="processed_logprobs", worker_extension_cls=WORKER_EXTENSION,
            enable_prefix_caching=True,
        )

        async def _start():
            return vllm.AsyncLLMEngine.from_engine_args(args)

        self.llm = self._run(_start(), startup_timeout_s, "start")

    @property
    def version(self) -> int:
        return self._version

    def _run(self, coro, timeout: float, what: str):
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()  # cancelling the generate coroutine aborts the vLLM request
            raise EngineTimeout(f"vllm engine: {what} did not finish within {timeout:g}s") from None

    def generate(self, prompt_ids: list[int], sampling: SamplingParams, timeout: float | None = None) -> GenerateResult:
        return self._run(self._generate(list(prompt_ids), sampling), self._timeout(timeout), "generate")

    async def _generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        params = to_vllm_sampling(sampling, self._vllm.SamplingParams)
        prompt = self._tokens_prompt(prompt_token_ids=prompt_ids)
        versions: list[int] = []
        final = None
        async for out in self.llm.generate(prompt, params, request_id=uuid.uuid4().hex):
            n = len(out.outputs[0].token_ids)  # cumulative output (the default output kind)
            versions.extend([self._version] * (n - len(versions)))
            final = out
        if final is None:
            raise EngineError("vllm engine: generate produced no output")
        return from_vllm_output(final, versions)

    def update_weights(self, version: int, weights: dict[str, Any], timeout: float | None = None) -> None:
        items = [(name, t.detach().cpu()) for name, t in weights.items()]

        async def _update():
            await self.llm.collective_rpc("sao_load_weights", args=(items,))
            self._version = version
            await self.llm.reset_prefix_cache()

        self._run(_update(), self._timeout(timeout), f"weight update to version {version}")

    def health(self) -> dict[str, Any]:
        return {"ok": self._thread.is_alive() and not getattr(self.llm, "errored", False), "kind": self.kind,
                "version": self._version, "model": self.model_path}

    def close(self) -> None:
        try:
            if hasattr(self.llm, "shutdown"):
                self._loop.call_soon_threadsafe(self.llm.shutdown)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
