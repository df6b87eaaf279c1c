"""``hf`` engine: a transformers causal LM on CPU (tests, demo), serving concurrent requests.

One background thread owns the model. Callers put requests on a queue and wait on a future with a
timeout. The loop, between steps, applies weight updates (so a request in flight continues on the
new version; its KV cache from the old weights is kept, as in-flight updates do), admits new
requests (prefill each alone, sample its first token), then advances every active request by one
token in ONE batched forward: the per-request KV caches are left-padded into one batched cache,
rebuilt only when the set of active requests changes. Each token records the policy version that
sampled it. Sampling follows ``harness.engines.sampling``. An MoE model's routers are watched
(``harness.engines.routes.RouteRecorder``): a request with ``routes_from`` gets the experts of its
prompt's positions from there (its prefill) and of each token it fed back (its decode steps).

Prefix cache: the KV caches of the last ``PREFIX_ENTRIES`` finished requests (their prompt and sampled
tokens but the last, the tokens the cache holds) are kept; a new prompt that extends one of them
prefills only its new tokens from there, as an agent's next turn extends its last one (the proxy sends
the history token for token). A weight update empties it (the cached keys and values are the old
weights'); a request with ``routes_from`` before the cached length prefills in full (the cache keeps no
routes).
"""
from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from sao_harness.harness.engines.protocol import (
    Engine,
    EngineError,
    EngineTimeout,
    GenerateResult,
    SamplingParams,
    find_stop,
)
from sao_harness.harness.engines.routes import RouteRecorder
from sao_harness.harness.engines.sampling import sample_token
from sao_harness.harness.tiny_model import resolve_model_path

PREFIX_ENTRIES = 32  # finished requests' KV caches a new prompt may extend (module doc)


class _Request:
    def __init__(self, prompt: list[int], sampling: SamplingParams, generator: torch.Generator):
        self.prompt = prompt
        self.sp = sampling
        self.gen = generator
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self.ids: list[int] = []
        self.lps: list[float] = []
        self.versions: list[int] = []
        self.cancelled = False
        self.finish: str | None = None
        self.stop_str: str | None = None
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # own cache while not batched
        self.routes: list | None = None if sampling.routes_from is None else []  # numpy [n, layers, top_k] parts
        self.cached = 0  # tokens in this request's KV cache
        self.t0 = time.perf_counter()


class HFEngine(Engine):
    kind = "hf"

    @classmethod
    def from_config(cls, cfg, **kwargs) -> HFEngine:
        """Reads model.path / dtype, engine.device / max_batch / timeout_s / num_threads, run.seed."""
        e = cfg.engine
        return cls(resolve_model_path(cfg.model), device=e.device, dtype=cfg.model.dtype, max_batch=e.max_batch,
                   timeout_s=e.timeout_s, seed=cfg.run.seed, num_threads=e.num_threads or None, **kwargs)

    def __init__(self, model_path: str, device: str = "cpu", dtype: str = "float32", max_batch: int = 8,
                 timeout_s: float = 600.0, seed: int = 0, num_threads: int | None = None):
        """``num_threads``: torch intra-op threads of the engine thread only (a per-thread setting);
        None: 1 for models under 100M parameters (they gain nothing from more, and on a shared CPU
        spinning threads cost up to 7x), else torch's default."""
        # lazy: transformers is heavy
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        self.model_path = str(model_path)
        self.device = torch.device(device)
        self.max_batch = max_batch
        self.timeout_s = timeout_s
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=getattr(torch, dtype)).to(self.device)
        self.model.eval()
        self._route_log = RouteRecorder(self.model)
        self.returns_routes = self._route_log.enabled
        gen_eos = getattr(self.model.generation_config, "eos_token_id", None)
        gen_eos = gen_eos if isinstance(gen_eos, list) else [gen_eos]
        self.eos_ids = {int(i) for i in [*gen_eos, self.tokenizer.eos_token_id] if i is not None}
        self.max_positions = int(getattr(self.model.config, "max_position_embeddings", 1 << 30))
        if num_threads is None and sum(p.numel() for p in self.model.parameters()) < 100_000_000:
            num_threads = 1
        self.num_threads = num_threads
        self._version = 0
        self._rng = torch.Generator().manual_seed(seed)
        self._inbox: queue.Queue = queue.Queue()
        self._waiting: list[_Request] = []  # admitted to the engine, not yet prefilled (batch full)
        self._active: list[_Request] = []  # in the order of the batched cache's rows
        self._cache = None  # batched DynamicCache of self._active, or None when it must be rebuilt
        self._mask: torch.Tensor | None = None  # [B, L] 1 = real token, 0 = left padding
        self._prefix: OrderedDict[tuple[int, ...], list] = OrderedDict()  # cached tokens -> per-layer (k, v)
        self._stats = {"steps": 0, "tokens": 0, "prefills": 0, "prefix_hits": 0, "rebuilds": 0, "updates": 0}
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hf-engine", daemon=True)
        self._thread.start()

    # --- public API (any thread) -----------------------------------------------------------
    @property
    def version(self) -> int:
        return self._version

    def generate(self, prompt_ids: list[int], sampling: SamplingParams, timeout: float | None = None) -> GenerateResult:
        if self._closed.is_set():
            raise EngineError("hf engine is closed")
        if not prompt_ids:
            raise EngineError("hf engine: empty prompt")
        vocab = self.model.config.vocab_size
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise EngineError(f"hf engine: prompt holds token ids outside [0, {vocab})")
        if sampling.routes_from is not None and sampling.routes_from > len(prompt_ids):
            raise EngineError(f"hf engine: routes_from={sampling.routes_from} is past the prompt's "
                              f"{len(prompt_ids)} tokens")
        seed = sampling.seed if sampling.seed is not None else int(torch.randint(0, 2**62, (1,), generator=self._rng))
        req = _Request(list(prompt_ids), sampling, torch.Generator().manual_seed(seed))
        self._inbox.put(("generate", req))
        t = self._timeout(timeout)
        try:
            return req.future.result(timeout=t)
        except concurrent.futures.TimeoutError:
            req.cancelled = True
            raise EngineTimeout(f"hf engine: generate did not finish within {t:g}s "
                                f"({len(req.ids)} of max {sampling.max_tokens} tokens sampled); "
                                "request cancelled") from None

    def update_weights(self, version: int, weights: dict[str, Any], timeout: float | None = None) -> None:
        if self._closed.is_set():
            raise EngineError("hf engine is closed")
        if not isinstance(version, int) or version < 0:
            raise EngineError(f"hf engine: version must be an integer >= 0, got {version!r}")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._inbox.put(("update", (version, weights, fut)))
        t = self._timeout(timeout)
        try:
            fut.result(timeout=t)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise EngineTimeout(f"hf engine: weight update to version {version} not applied within {t:g}s") from None

    def health(self) -> dict[str, Any]:
        return {"ok": self._thread.is_alive() and not self._closed.is_set(), "kind": self.kind,
                "version": self._version, "model": self.model_path, "active": len(self._active),
                "waiting": len(self._waiting) + self._inbox.qsize(), **self._stats}

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=10)
        err = EngineError("hf engine closed")
        for req in self._waiting + self._active:
            if not req.future.done():
                req.future.set_exception(err)
        while True:
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                break
            fut = item.future if kind == "generate" else item[2]
            if not fut.done():
                fut.set_exception(err)

    # --- the generation loop (engine thread only) ------------------------------------------
    def _loop(self) -> None:
        if self.num_threads:
            torch.set_num_threads(self.num_threads)  # this thread's intra-op pool only
        while not self._closed.is_set():
            try:
                self._drain_inbox(block=not (self._active or self._waiting))
                self._admit()
                if self._active:
                    self._decode_step()
            except Exception as e:  # a bug or an OOM: fail the requests in flight, keep serving
                err = EngineError(f"hf engine: generation step failed: {type(e).__name__}: {e}")
                for req in self._active + self._waiting:
                    if not req.future.done():
                        req.future.set_exception(err)
                self._active, self._waiting, self._cache, self._mask = [], [], None, None

    def _drain_inbox(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=0.05) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, payload = item
            if kind == "generate":
                self._waiting.append(payload)
            else:
                self._apply_update(*payload)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    @torch.no_grad()
    def _apply_update(self, version: int, weights: dict[str, Any], fut: concurrent.futures.Future) -> None:
        if fut.cancelled():
            return
        try:
            state = self.model.state_dict()
            unknown = [n for n in weights if n not in state]
            if unknown:
                raise EngineError(f"hf engine: weight update names {len(unknown)} unknown tensors, e.g. {unknown[:3]}")
            for name, t in weights.items():
                if tuple(t.shape) != tuple(state[name].shape):
                    raise EngineError(f"hf engine: weight update: '{name}' has shape {tuple(t.shape)}, "
                                      f"model has {tuple(state[name].shape)}")
            for name, t in weights.items():
                state[name].copy_(t.to(device=state[name].device, dtype=state[name].dtype))
            self._prefix.clear()  # the old weights' keys and values
            self._version = version
            self._stats["updates"] += 1
            fut.set_result(None)
        except Exception as e:
            fut.set_exception(e if isinstance(e, EngineError) else EngineError(f"hf engine: weight update failed: {e}"))

    @torch.no_grad()
    def _admit(self) -> None:
        """Prefill waiting requests (one forward each) while the batch has room."""
        self._retire()
        while self._waiting and len(self._active) < self.max_batch:
            req = self._waiting.pop(0)
            if req.cancelled:
                continue
            start, out = self._prefill(req)
            req.kv = [(layer.keys, layer.values) for layer in out.cache.layers]
            req.cached = len(req.prompt)
            if req.routes is not None:
                req.routes.append(self._route_log.take()[req.sp.routes_from - start:])
            elif self.returns_routes:
                self._route_log.discard()
            self._stats["prefills"] += 1
            self._sample(req, out.logits[0, -1])
            if req.finish is None:
                self._split_cache()  # membership changes: the batched cache is rebuilt before the next step
                self._active.append(req)
            else:
                self._remember(req.prompt, req.kv)
                self._resolve(req)

    def _prefill(self, req: _Request):
        """One forward over the prompt, or over its tokens past the longest cached prefix; (start, output)."""
        limit = len(req.prompt) - 1 if req.sp.routes_from is None else min(len(req.prompt) - 1, req.sp.routes_from)
        key = max((k for k in self._prefix if len(k) <= limit and req.prompt[len(k) - 1] == k[-1]
                   and tuple(req.prompt[:len(k)]) == k), key=len, default=None)
        if key is None:
            return 0, self.model(input_ids=torch.tensor([req.prompt], device=self.device), use_cache=True,
                                 logits_to_keep=1)
        from transformers import DynamicCache  # lazy: transformers is heavy

        self._prefix.move_to_end(key)
        self._stats["prefix_hits"] += 1
        start = len(key)
        ids = torch.tensor([req.prompt[start:]], device=self.device)
        positions = torch.arange(start, len(req.prompt), device=self.device)[None]
        return start, self.model(input_ids=ids, position_ids=positions, use_cache=True, logits_to_keep=1,
                                 cache=DynamicCache(ddp_cache_data=list(self._prefix[key])))

    def _remember(self, tokens: list[int], kv: list) -> None:
        """Keep `kv`, the KV cache of `tokens`, for prompts that extend them (least recently used out first)."""
        self._prefix[tuple(tokens)] = kv
        self._prefix.move_to_end(tuple(tokens))
        while len(self._prefix) > PREFIX_ENTRIES:
            self._prefix.popitem(last=False)

    def _retire(self) -> None:
        """Drop finished and cancelled requests from the batch."""
        keep = [r for r in self._active if r.finish is None and not r.cancelled]
        if len(keep) != len(self._active):
            self._split_cache()
            self._active = keep
            self._cache = None

    def _split_cache(self) -> None:
        """Give every batched request its own (unpadded) KV cache back."""
        if self._cache is None:
            return
        width = self._mask.shape[1]
        for row, req in enumerate(self._active):
            start = width - req.cached
            req.kv = [(layer.keys[row:row + 1, :, start:], layer.values[row:row + 1, :, start:])
                      for layer in self._cache.layers]
        self._cache = None

    def _build_cache(self) -> None:
        from transformers import DynamicCache  # lazy: transformers is heavy

        width = max(r.cached for r in self._active)
        layers = []
        for li in range(len(self._active[0].kv)):
            ks, vs = [], []
            for req in self._active:
                k, v = req.kv[li]
                pad = width - req.cached
                ks.append(torch.nn.functional.pad(k, (0, 0, pad, 0)))
                vs.append(torch.nn.functional.pad(v, (0, 0, pad, 0)))
            layers.append((torch.cat(ks), torch.cat(vs)))
        self._cache = DynamicCache(ddp_cache_data=layers)
        self._mask = torch.tensor([[0] * (width - r.cached) + [1] * r.cached for r in self._active],
                                  dtype=torch.long, device=self.device)
        for req in self._active:
            req.kv = None
        self._stats["rebuilds"] += 1

    @torch.no_grad()
    def _decode_step(self) -> None:
        """Feed every active request's last sampled token; sample the next one for each."""
        if self._cache is None:
            self._build_cache()
        batch = len(self._active)
        input_ids = torch.tensor([[r.ids[-1]] for r in self._active], device=self.device)
        positions = torch.tensor([[r.cached] for r in self._active], device=self.device)
        mask = torch.cat([self._mask, torch.ones(batch, 1, dtype=torch.long, device=self.device)], dim=1)
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, cache=self._cache,
                         use_cache=True, logits_to_keep=1)
        self._cache, self._mask = out.cache, mask
        self._stats["steps"] += 1
        wanted = self.returns_routes and any(r.routes is not None for r in self._active)
        routes = self._route_log.take() if wanted else None  # [batch, layers, top_k]: row = request
        if self.returns_routes and not wanted:
            self._route_log.discard()
        for row, req in enumerate(self._active):
            req.cached += 1
            if req.routes is not None:
                req.routes.append(routes[row:row + 1])
            if req.cancelled:
                continue
            self._sample(req, out.logits[row, -1])
            if req.finish is not None:
                start = self._mask.shape[1] - req.cached
                self._remember(req.prompt + req.ids[:-1], [(layer.keys[row:row + 1, :, start:].clone(),
                                                            layer.values[row:row + 1, :, start:].clone())
                                                           for layer in self._cache.layers])
                self._resolve(req)

    def _sample(self, req: _Request, logits: torch.Tensor) -> None:
        sp = req.sp
        tok, lp = sample_token(logits, sp.temperature, sp.top_p, sp.top_k, generator=req.gen)
        req.ids.append(tok)
        req.lps.append(lp)
        req.versions.append(self._version)
        self._stats["tokens"] += 1
        if tok in self.eos_ids:
            req.finish = "stop"
        elif sp.stop and (hit := self._stop_hit(req)) is not None:
            req.finish, req.stop_str = "stop", hit
        elif len(req.ids) >= sp.max_tokens or len(req.prompt) + len(req.ids) >= self.max_positions:
            req.finish = "length"

    def _stop_hit(self, req: _Request) -> str | None:
        """A stop string completed by the newest token (only the tail is decoded: O(1) per token)."""
        longest = max(len(s) for s in req.sp.stop)
        tail = self.tokenizer.decode(req.ids[-(4 * longest + 4):], skip_special_tokens=False)
        hit = find_stop(tail, req.sp.stop)  # an earlier hit would have stopped generation already
        return None if hit is None else hit[1]

    def _resolve(self, req: _Request) -> None:
        if not req.future.done():
            routes = np.concatenate(req.routes) if req.routes else None
            req.future.set_result(GenerateResult(req.ids, req.lps, req.finish, req.versions, req.stop_str,
                                                 {"engine_s": time.perf_counter() - req.t0}, routes))
