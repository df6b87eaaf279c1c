"""A stand-in engine for benchmarks of the pipeline (``testbed.simulated.engine_s``): no model, a sleep per call."""
from __future__ import annotations

import math
import random
import time

from sao_harness.harness.engines.protocol import GenerateResult, SamplingParams
from sao_harness.harness.engines.stub import StubEngine


class SleepEngine(StubEngine):
    """A stand-in engine for the benchmark: each `generate` sleeps `turn_s` (any number in parallel)
    and returns `tokens_per_turn` uniform token ids (the last one EOS) with their uniform logprob."""

    kind = "sleep"

    def __init__(self, turn_s: float, vocab_size: int, eos_id: int, tokens_per_turn: int = 4, seed: int = 0,
                 first_id: int = 16, timeout_s: float = 600.0):
        super().__init__(timeout_s)
        self.turn_s, self.vocab, self.eos, self.n, self.first = turn_s, vocab_size, eos_id, tokens_per_turn, first_id
        self._rng = random.Random(seed)

    def generate(self, prompt_ids: list[int], sampling: SamplingParams, timeout: float | None = None) -> GenerateResult:
        time.sleep(self.turn_s)
        n = max(1, min(self.n, sampling.max_tokens))
        with self._lock:
            ids = [self._rng.randrange(self.first, self.vocab) for _ in range(n - 1)] + [self.eos]
            self.calls += 1
            v = self._version
        lp = -math.log(self.vocab - self.first)
        return GenerateResult(ids, [lp] * n, "stop", [v] * n)
