"""The sampling rule, shared by the engines (rollout) and the trainer (recompute).

``sampling_logprobs(logits, temperature, top_p, top_k)`` returns the log-probabilities of the
distribution a token is actually drawn from. The same function runs in the engine before it samples
and in the trainer when it recomputes logprobs, so on-policy the ratio is 1 up to float noise.

The rule (the same order as vLLM's sampler with ``logprobs_mode="processed_logprobs"``):
1. ``logits.float() / temperature``;
2. top-k (``top_k > 0``): keep the logits >= the k-th largest (ties at the k-th value are kept);
3. top-p (``top_p < 1``): on the top-k-filtered distribution, sort probabilities ascending and drop
   every token whose ascending cumulative probability is <= ``1 - top_p``; the most likely token is
   always kept (this is the smallest set of most-likely tokens whose mass reaches ``top_p``);
4. renormalise: ``log_softmax`` over the kept tokens; dropped tokens get ``-inf``.

Temperature 0 (below ``GREEDY_EPS``) means greedy decoding: the engine takes the argmax, and the
reported logprob is ``log_softmax(logits)`` at temperature 1 with no top-k / top-p filtering (what
vLLM reports for greedy requests). Greedy is for evaluation; RL rollouts should sample (T > 0).
"""
from __future__ import annotations

import torch

GREEDY_EPS = 1e-5  # temperatures below this are greedy (vLLM's _SAMPLING_EPS)


def is_greedy(temperature: float) -> bool:
    return temperature < GREEDY_EPS


def sampling_logprobs(logits: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0) -> torch.Tensor:
    """Log-probs [..., V] (float32) of the sampling distribution for ``logits`` [..., V]; see module doc."""
    x = logits.float()
    if is_greedy(temperature):
        return torch.log_softmax(x, dim=-1)
    x = x / temperature
    vocab = x.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=False)
        cum = torch.softmax(sorted_x, dim=-1).cumsum(dim=-1)
        drop_sorted = cum <= 1.0 - top_p
        drop_sorted[..., -1] = False  # the most likely token always stays
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return torch.log_softmax(x, dim=-1)


def sample_token(logits: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0,
                 generator: torch.Generator | None = None) -> tuple[int, float]:
    """Draw one token from ``logits`` [V] under the rule; return ``(token_id, its logprob)``."""
    logp = sampling_logprobs(logits, temperature, top_p, top_k)
    if is_greedy(temperature):
        tok = int(torch.argmax(logits))
    else:
        tok = int(torch.multinomial(logp.exp(), 1, generator=generator))
    return tok, float(logp[tok])
