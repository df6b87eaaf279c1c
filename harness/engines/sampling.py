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


def filter_logits_(z: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0) -> torch.Tensor:
    """Steps 1-3 of the rule, IN PLACE on fp32 logits ``z`` [..., V]: ``z / T``, then -inf at the tokens
    top-k and top-p drop. The trainer calls it on chunk buffers; no gradient flows through it."""
    if temperature != 1.0:
        z.div_(temperature)
    vocab = z.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(z, top_k, dim=-1).values[..., -1:]
        z.masked_fill_(z < kth, float("-inf"))
    if top_p < 1.0:
        sorted_z, order = torch.sort(z, dim=-1, descending=False)
        cum = torch.softmax(sorted_z, dim=-1).cumsum_(dim=-1)
        drop_sorted = cum <= 1.0 - top_p
        drop_sorted[..., -1] = False  # the most likely token always stays
        z.masked_fill_(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
    return z


def sampling_logprobs(logits: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0) -> torch.Tensor:
    """Log-probs [..., V] (float32) of the sampling distribution for ``logits`` [..., V]; see module doc."""
    x = logits.float()
    if is_greedy(temperature):
        return torch.log_softmax(x, dim=-1)
    z = x.clone() if x is logits else x  # never modify the caller's logits
    return torch.log_softmax(filter_logits_(z, temperature, top_p, top_k), dim=-1)


def sample_token(logits: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0,
                 generator: torch.Generator | None = None) -> tuple[int, float]:
    """Draw one token from ``logits`` [V] under the rule; return ``(token_id, its logprob)``."""
    logp = sampling_logprobs(logits, temperature, top_p, top_k)
    if is_greedy(temperature):
        tok = int(torch.argmax(logits))
    else:
        tok = int(torch.multinomial(logp.exp(), 1, generator=generator))
    return tok, float(logp[tok])
