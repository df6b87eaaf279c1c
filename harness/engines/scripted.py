"""``scripted`` engine — a TEST DOUBLE, not a model.

It answers each ``generate`` with the next of a given list of assistant replies (text, e.g. with
Hermes ``<tool_call>`` blocks), encoded with the model's tokenizer and followed by the token that ends
the turn (``end_of_turn``: the EOS here), each token with logprob 0.0 and the engine's current version.
It honours ``max_tokens`` (finish ``length``) and stop strings (finish ``stop``, the reply cut after the
stop string, no end token). Tests and benches use it to drive end-to-end episodes to ``resolved``
without a trained model. ``delay_s`` makes every call slow, to exercise timeouts. When the replies run
out, ``generate`` raises ``EngineError``.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Any

from sao_harness.harness.engines.protocol import EngineError, EngineTimeout, GenerateResult, SamplingParams, find_stop
from sao_harness.harness.engines.stub import StubEngine
from sao_harness.harness.tiny_model import resolve_model_path


class ScriptedEngine(StubEngine):
    kind = "scripted"

    @classmethod
    def from_config(cls, cfg, **kwargs) -> ScriptedEngine:
        """Reads model.path (its tokenizer) and engine.timeout_s; ``kwargs`` give ``replies=`` and the rest."""
        return cls(resolve_model_path(cfg.model), timeout_s=cfg.engine.timeout_s, **kwargs)

    def __init__(self, tokenizer, replies: list[str] | tuple[str, ...] = (), timeout_s: float = 600.0,
                 delay_s: float = 0.0, eos: bool = True):
        if isinstance(tokenizer, str):
            from transformers import AutoTokenizer  # lazy: transformers is heavy, only for a tokenizer path

            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        super().__init__(timeout_s)
        self.tokenizer = tokenizer
        self.delay_s = delay_s
        self.eos = eos
        self._replies: deque[str] = deque(replies)
        self.sampling = SamplingParams()  # the request being answered (set under the lock, for next_reply)

    def add_replies(self, *replies: str) -> None:
        with self._lock:
            self._replies.extend(replies)

    def next_reply(self, prompt_ids: list[int]) -> str:
        """The next reply's text (called under the engine's lock, ``self.sampling`` the request's parameters);
        subclasses may pick by prompt."""
        if not self._replies:
            raise EngineError("scripted engine: no scripted replies left")
        return self._replies.popleft()

    def end_of_turn(self, text: str) -> int:
        """The stop token emitted after reply ``text`` (when no stop string cut it): the EOS."""
        return self.tokenizer.eos_token_id

    @staticmethod
    def cut_at_stop(text: str, stop) -> tuple[str, str | None]:
        """``text`` as emitted under stop strings ``stop``: cut after the first one it holds, and that string."""
        hit = find_stop(text, stop)
        return (text, None) if hit is None else (text[:hit[0] + len(hit[1])], hit[1])

    def generate(self, prompt_ids: list[int], sampling: SamplingParams, timeout: float | None = None) -> GenerateResult:
        t = self._timeout(timeout)
        if self.delay_s:
            time.sleep(min(self.delay_s, t))
            if self.delay_s >= t:
                raise EngineTimeout(f"scripted engine: generate did not finish within {t:g}s "
                                    f"(delay_s={self.delay_s:g})")
        with self._lock:
            self.sampling = sampling
            text = self.next_reply(prompt_ids)
            end = self.end_of_turn(text) if self.eos else None
            self.calls += 1
        finish = "stop"
        text, stop_str = self.cut_at_stop(text, sampling.stop)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if end is not None and stop_str is None:
            ids.append(end)
        if len(ids) > sampling.max_tokens:
            ids, finish, stop_str = ids[:sampling.max_tokens], "length", None
        v = self._version
        return GenerateResult(ids, [0.0] * len(ids), finish, [v] * len(ids), stop_str)

    def health(self) -> dict[str, Any]:
        return {**super().health(), "replies_left": len(self._replies)}
