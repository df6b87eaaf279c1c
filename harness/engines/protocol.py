"""The engine protocol: token ids in, token ids + logprobs + policy versions out.

Every engine (``hf``, ``vllm``, ``scripted``) implements:
- ``generate(prompt_ids, sampling, timeout=None) -> GenerateResult``: the sampled ids, the logprob of
  each under the sampling distribution (``harness.engines.sampling``), the finish reason (``stop`` at
  an EOS id or a stop string, ``length`` at ``max_tokens``) and the policy version that sampled each
  token (a weight update may land mid-request: the request continues on the new version); with
  ``sampling.routes_from`` set, an engine whose ``returns_routes`` is true also gives the experts an MoE
  model routed each input token to (``harness.engines.routes``);
- ``update_weights(version, weights, timeout=None)``: load a state dict (name -> tensor, the names of
  the Hugging Face model; a subset is allowed) between generation steps and set the policy version;
- ``health() -> dict`` (``ok``, ``kind``, ``version``, ...), never blocking;
- ``close()``.
Every call has a timeout (``timeout`` or the engine's default, ``engine.timeout_s``): a call that
exceeds it raises ``EngineTimeout`` (the request is cancelled), never hangs.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length"]


class EngineError(RuntimeError):
    """The engine failed a call (bad weights, a crashed generation loop, a closed engine)."""


class EngineTimeout(EngineError):
    """An engine call exceeded its timeout; the request was cancelled."""


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_tokens: int = 1024
    stop: tuple[str, ...] = ()  # stop strings; the sampled ids keep the tokens that completed one
    seed: int | None = None
    routes_from: int | None = None  # None: no routed experts; n: those of positions n.. (harness.engines.routes)

    def __post_init__(self):
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)
                and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not (isinstance(self.top_k, int) and self.top_k >= 0):
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not (isinstance(self.max_tokens, int) and self.max_tokens > 0):
            raise ValueError(f"max_tokens must be an integer > 0, got {self.max_tokens!r}")
        if self.seed is not None and not (isinstance(self.seed, int) and not isinstance(self.seed, bool)):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be non-empty strings, got {self.stop!r}")
        if self.routes_from is not None and not (isinstance(self.routes_from, int) and self.routes_from >= 0):
            raise ValueError(f"routes_from must be an integer >= 0 or None, got {self.routes_from!r}")

    def to_dict(self) -> dict[str, Any]:
        """The sampling distribution and limits (what a trace records; ``routes_from`` is a request detail)."""
        d = asdict(self)
        d["stop"] = list(self.stop)
        del d["routes_from"]
        return d


@dataclass
class GenerateResult:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    versions: list[int]
    stop_str: str | None = None  # the stop string that ended generation, if one did
    timings: dict[str, float] = field(default_factory=dict)
    # asked with sampling.routes_from: int16 [prompt - routes_from + tokens - 1, MoE layers, top_k]
    # (harness.engines.routes); None from an engine or a model that has none
    routes: Any = None

    def __post_init__(self):
        n = len(self.token_ids)
        if len(self.logprobs) != n or len(self.versions) != n:
            raise EngineError(f"engine result: {n} tokens but {len(self.logprobs)} logprobs and "
                              f"{len(self.versions)} versions")


class Engine(ABC):
    kind: str = "?"
    timeout_s: float = 600.0
    returns_routes: bool = False  # answers sampling.routes_from with GenerateResult.routes

    @abstractmethod
    def generate(self, prompt_ids: list[int], sampling: SamplingParams, timeout: float | None = None) -> GenerateResult:
        ...

    @abstractmethod
    def update_weights(self, version: int, weights: dict[str, Any], timeout: float | None = None) -> None:
        ...

    @abstractmethod
    def health(self) -> dict[str, Any]:
        ...

    @property
    @abstractmethod
    def version(self) -> int:
        ...

    def close(self) -> None:  # noqa: B027 - optional hook: engines with resources override it, the default is a no-op
        """Release the engine's resources (default: nothing to release)."""

    def _timeout(self, timeout: float | None) -> float:
        return self.timeout_s if timeout is None else timeout

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def find_stop(text: str, stops: tuple[str, ...] | list[str]) -> tuple[int, str] | None:
    """The earliest occurrence of any stop string in ``text``: ``(index, stop)``, or None."""
    best = None
    for s in stops:
        i = text.find(s)
        if i >= 0 and (best is None or i < best[0]):
            best = (i, s)
    return best
