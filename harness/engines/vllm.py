"""``vllm`` engine: vLLM's async engine (v1 ``AsyncLLM``) on GPUs. Imported only when selected.

Written against vLLM's public Python API (read from the source of 0.33.0 and checked against 0.29.0,
the release the ``gpu`` extra pins); it needs a GPU and ``pip install -e '.[gpu]'`` and was not run on
the CPU machines this project is tested on. The code around the engine is tested with a fake ``vllm`` that
behaves like the real one at its boundaries (RPC arguments serialised, the prefix-cache reset
refused while requests hold blocks, vLLM's temperature rules).

- Engine: ``vllm.AsyncLLMEngine.from_engine_args(vllm.AsyncEngineArgs(...,
  logprobs_mode="processed_logprobs", worker_extension_cls=WORKER_EXTENSION))`` on an asyncio loop
  in a background thread; sync callers wait on that loop with a timeout. Every failure of vLLM
  reaches the caller as ``EngineError`` (``EngineTimeout`` for a timeout).
- Logprobs: ``SamplingParams(logprobs=0)`` returns the sampled token's logprob, and
  ``processed_logprobs`` makes it the logprob after temperature, top-k and top-p (the rule of
  ``harness.engines.sampling``; vLLM's default, ``raw_logprobs``, ignores temperature).
- Temperature (``vllm_temperature``): T below ``GREEDY_EPS`` is sent as 0 (greedy in both; vLLM
  would raise 1e-6 to 0.01 and sample). vLLM raises 0 < T < 0.01 to 0.01, so the logprobs would be
  of 0.01 while the trainer recomputes them at T: an ``EngineError`` (use 0 or >= 0.01). vLLM
  rejects T > 2: an ``EngineError`` naming the value.
- Prompts are token ids: ``TokensPrompt(prompt_token_ids=...)``.
- Weight update: ``collective_rpc`` arguments are msgspec-serialised (a tensor arrives in the worker
  as a ``[dtype, shape, index]`` list), so only names, dtype names and shapes cross it. The tensors
  travel through a gloo process group of its own (rank 0 = this process, rank 1 + r = vLLM worker r),
  set up once through ``collective_rpc("sao_join_weight_sync", host, port, ...)``; each update
  broadcasts them while ``collective_rpc("sao_receive_weights", names, dtypes, shapes)`` receives
  them on every worker and feeds them to ``model_runner.model.load_weights`` (vLLM's loader maps
  Hugging Face names, fused QKV / experts, tensor-parallel shards). Gloo, not NCCL or vLLM's
  weight-transfer API (``init_weight_transfer_engine`` / ``update_weights``, backends ``nccl`` and
  ``ipc``): the weights reach this process as CPU tensors (Ray's object store) and the GPUs of this
  process are vLLM's, and NCCL cannot pair two ranks on one GPU. Single node (the store is on
  127.0.0.1, vLLM's workers are local processes).
- Update sequence: ``pause_generation(mode="keep", clear_cache=False)`` (requests in flight freeze
  between two steps), load, ``reset_prefix_cache(reset_running_requests=True)`` (running requests
  are preempted and recompute their KV with the new weights; a reset that did not happen is an
  ``EngineError``), set the version, ``resume_generation()``. Requests in flight continue on the new
  weights, and no token is computed with the new weights on the old KV.
- Versions: a token is tagged with the engine's version when its output chunk reaches this wrapper;
  a token sampled in the last step before an update can be tagged with the new version (at most one
  engine step of slack).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import threading
import uuid
from typing import Any

import torch
import torch.distributed as dist

from harness.engines.protocol import (
    Engine,
    EngineError,
    EngineTimeout,
    GenerateResult,
    SamplingParams,
)
from harness.engines.sampling import GREEDY_EPS

WORKER_EXTENSION = "harness.engines.vllm.SaoWorkerExtension"
VLLM_MIN_TEMPERATURE = 0.01  # vLLM's _MAX_TEMP: 0 < T < this is raised to it
VLLM_MAX_TEMPERATURE = 2.0  # vLLM rejects T above this
SYNC_HOST = "127.0.0.1"


def open_sync_group(host: str, port: int, rank: int, world_size: int, timeout_s: float,
                    store: dist.Store | None = None) -> dist.ProcessGroup:
    """A gloo group beside torch.distributed's default one (vLLM's workers own that). Rank 0 hosts the
    store (passed as ``store``); the others connect to ``host:port``. Blocks until all ranks joined."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if store is None:
        store = dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    return dist.ProcessGroupGloo(dist.PrefixStore("sao-weights", store), rank, world_size, timeout)


class SaoWorkerExtension:
    """Mixed into vLLM's GPU worker (``worker_extension_cls``): methods reachable by ``collective_rpc``.
    Their arguments are plain values (they are serialised); tensors come through the gloo group."""

    _sao_group = None

    def sao_join_weight_sync(self, host: str, port: int, world_size: int, timeout_s: float) -> int:
        """Join the weight group as rank 1 + this worker's rank; return that rank."""
        rank = 1 + int(self.rank)
        self._sao_group = open_sync_group(host, int(port), rank, int(world_size), float(timeout_s))
        return rank

    def sao_receive_weights(self, names: list[str], dtypes: list[str], shapes: list[list[int]]) -> int:
        """Receive each tensor from rank 0, in order, and load it; return how many were loaded. Every
        tensor is received even after a load failed (the group stays in step), then the error is raised."""
        if self._sao_group is None:
            raise RuntimeError("sao_receive_weights before sao_join_weight_sync")
        model = self.model_runner.model
        device = next(model.parameters()).device
        error = None
        for name, dtype, shape in zip(names, dtypes, shapes, strict=True):
            buf = torch.empty([int(s) for s in shape], dtype=getattr(torch, dtype))
            self._sao_group.broadcast(buf, 0).wait()
            if error is None:
                try:
                    model.load_weights(weights=[(name, buf.to(device))])
                except Exception as e:  # noqa: BLE001 - raised once the group is drained
                    error = e
        if error is not None:
            raise error
        return len(names)


def vllm_temperature(t: float) -> float:
    """Our temperature as vLLM must get it (module doc); ``EngineError`` where vLLM would change it."""
    if t < GREEDY_EPS:
        return 0.0
    if t < VLLM_MIN_TEMPERATURE:
        raise EngineError(f"vllm engine: temperature {t:g} is in (0, {VLLM_MIN_TEMPERATURE}): vLLM would "
                          f"sample at {VLLM_MIN_TEMPERATURE} while the logprobs are of {t:g}; use 0 (greedy) "
                          f"or >= {VLLM_MIN_TEMPERATURE}")
    if t > VLLM_MAX_TEMPERATURE:
        raise EngineError(f"vllm engine: temperature {t:g} is above {VLLM_MAX_TEMPERATURE:g}, the most vLLM accepts")
    return float(t)


def to_vllm_sampling(sp: SamplingParams, sampling_params_cls) -> Any:
    """Our ``SamplingParams`` -> ``vllm.SamplingParams`` (one sample, the sampled token's logprob)."""
    temperature = vllm_temperature(sp.temperature)
    try:
        return sampling_params_cls(
            n=1,
            temperature=temperature,
            top_p=float(sp.top_p),
            top_k=int(sp.top_k),  # 0 = off in both
            max_tokens=int(sp.max_tokens),
            stop=list(sp.stop) or None,
            seed=sp.seed,
            logprobs=0,  # the sampled token's logprob only
            skip_special_tokens=False,
            include_stop_str_in_output=False,
        )
    except Exception as e:
        raise EngineError(f"vllm engine: vLLM rejected the sampling params {sp.to_dict()}: {e}") from e


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
            # lazy: vLLM is optional (GPU only)
            import vllm
            from vllm.inputs import TokensPrompt
        except ImportError as e:
            raise EngineError("engine.kind=vllm needs vLLM and a GPU (pip install -e '.[gpu]', see the "
                              f"README); import failed: {e}") from None
        self._vllm, self._tokens_prompt = vllm, TokensPrompt
        self.model_path = str(model_path)
        self.timeout_s = timeout_s
        self._version = 0
        self._world = 1 + int(tensor_parallel_size)  # this process + one rank per vLLM worker
        self._group: dist.ProcessGroup | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-engine", daemon=True)
        self._thread.start()

        async def _start():
            args = vllm.AsyncEngineArgs(
                model=self.model_path, dtype=dtype, tensor_parallel_size=tensor_parallel_size,
                gpu_memory_utilization=gpu_memory_utilization, seed=seed, max_model_len=max_model_len,
                logprobs_mode="processed_logprobs", worker_extension_cls=WORKER_EXTENSION,
                enable_prefix_caching=True,
            )
            return vllm.AsyncLLMEngine.from_engine_args(args)

        try:
            self.llm = self._run(_start(), startup_timeout_s, "start")
        except EngineError:
            self._loop.call_soon_threadsafe(self._loop.stop)
            raise

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
        except EngineError:
            raise
        except Exception as e:
            raise EngineError(f"vllm engine: {what} failed: {type(e).__name__}: {e}") from e

    def generate(self, prompt_ids: list[int], sampling: SamplingParams, timeout: float | None = None) -> GenerateResult:
        params = to_vllm_sampling(sampling, self._vllm.SamplingParams)
        return self._run(self._generate(list(prompt_ids), params), self._timeout(timeout), "generate")

    async def _generate(self, prompt_ids: list[int], params: Any) -> GenerateResult:
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
        if not weights:  # a version for the weights vLLM already serves (a resumed checkpoint)
            self._version = version
            return
        items = [(name, t.detach().to("cpu").contiguous()) for name, t in weights.items()]
        timeout = self._timeout(timeout)
        try:
            self._run(self._update(version, items, timeout), timeout, f"weight update to version {version}")
        except EngineError:
            self._group = None  # a broken transfer leaves the group out of step: join anew next time
            raise

    async def _join(self, timeout: float) -> None:
        store = dist.TCPStore(SYNC_HOST, 0, self._world, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=timeout))
        join = asyncio.ensure_future(self.llm.collective_rpc(
            "sao_join_weight_sync", args=(SYNC_HOST, store.port, self._world, timeout)))
        group = await self._loop.run_in_executor(None, open_sync_group, SYNC_HOST, store.port, 0,
                                                 self._world, timeout, store)
        ranks = await join
        if sorted(ranks) != list(range(1, self._world)):
            raise EngineError(f"vllm engine: weight group joined by ranks {ranks}, expected 1..{self._world - 1}")
        self._group = group

    def _send(self, tensors: list[torch.Tensor]) -> None:
        for t in tensors:
            self._group.broadcast(t, 0).wait()

    async def _update(self, version: int, items: list[tuple[str, torch.Tensor]], timeout: float) -> None:
        if self._group is None:
            await self._join(timeout)
        names = [n for n, _ in items]
        dtypes = [str(t.dtype).removeprefix("torch.") for _, t in items]
        shapes = [list(t.shape) for _, t in items]
        await self.llm.pause_generation(mode="keep", clear_cache=False)
        try:
            send = self._loop.run_in_executor(None, self._send, [t for _, t in items])
            loaded, _ = await asyncio.gather(
                self.llm.collective_rpc("sao_receive_weights", args=(names, dtypes, shapes)), send)
            if any(n != len(items) for n in loaded):
                raise EngineError(f"vllm engine: workers loaded {loaded} of {len(items)} tensors")
            if not await self.llm.reset_prefix_cache(reset_running_requests=True):
                raise EngineError(f"vllm engine: the prefix cache was not reset after loading version {version} "
                                  "(its KV is of the old weights)")
            self._version = version
        finally:
            await self.llm.resume_generation()

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
