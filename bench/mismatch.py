"""Train/inference mismatch on the tiny MoE at bf16, with routing replay off and on.

    .venv/bin/python bench/mismatch.py                 # 32 sampled replies of 128 tokens (~30 s)
    .venv/bin/python bench/mismatch.py --replies 128 --seed 1

The engine (``hf``, the model in bf16) samples replies to prompts of Python source text, recording its
routes; the trainer (SAOTrainer: fp32 master weights, bf16 autocast, the same weights) recomputes the
logprob of every sampled token, with its own routing (replay off) and with the engine's (replay on).
Printed per setting: |log pi_train - log pi_engine| over the sampled tokens (p50, p99, max) and the
fraction DIS would mask (log r outside (log(1 - eps_low), log(1 + eps_high)), trainer defaults); and the
route agreement: the fraction of the engine's token x layer x top-k choices the trainer's router makes
itself (replay off). The model is the tiny Qwen3-MoE of ``tests.support.vllm_testmodel`` (weights of
std 0.4: next-token distributions and routing as decisive as a trained model's, where the project's
tiny model at 0.02 is near-uniform and shows no mismatch to speak of). Last line:

    mismatch: |log r| p99 A -> B, max C -> D, masked E% -> F%, route agreement G% (replay off -> on)
"""
from __future__ import annotations

import argparse
import math
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch
from _common import ROOT

from sao_harness.harness.engines.hf import HFEngine
from sao_harness.harness.engines.protocol import SamplingParams
from sao_harness.harness.engines.routes import NO_ROUTE, ROUTE_DTYPE
from sao_harness.harness.trace import Segment, Trajectory
from sao_harness.trainer.algo.batch import build_batch, micro_batches, pack
from sao_harness.trainer.algo.sao import SAOTrainer
from sao_harness.trainer.config import TrainerConfig
from sao_harness.trainer.modeling.precision import train_mode
from tests.support.vllm_testmodel import ensure_test_model


def sample(model: Path, replies: int, tokens: int, seed: int) -> list[Trajectory]:
    """Replies of the bf16 engine to prompts cut from the standard library's source, with their routes."""
    engine = HFEngine(str(model), dtype="bfloat16", max_batch=8, seed=seed)
    text = (Path(sysconfig.get_paths()["stdlib"]) / "difflib.py").read_text()
    ids = engine.tokenizer.encode(text)
    rng = np.random.default_rng(seed)
    try:
        futures = []
        for i in range(replies):
            start = int(rng.integers(0, len(ids) - 64))
            prompt = ids[start:start + 64]
            futures.append((prompt, engine.generate(prompt, SamplingParams(max_tokens=tokens, seed=seed + i,
                                                                           routes_from=0))))
    finally:
        engine.close()
    out = []
    for i, (prompt, res) in enumerate(futures):
        routes = np.concatenate([res.routes, np.full((1, *res.routes.shape[1:]), NO_ROUTE, dtype=ROUTE_DTYPE)])
        out.append(Trajectory(task_id=f"r{i}", reward=0.0, routed_experts=routes, segments=[
            Segment("observation", prompt), Segment("action", res.token_ids, res.logprobs, res.versions)]))
    return out


def measure(model: Path, trajectories: list[Trajectory], replay: str) -> dict:
    """The trainer's |log r| over the sampled tokens, the DIS-masked fraction and the route agreement."""
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16)  # the model dtype: bf16 compute
    config = TrainerConfig(advantage="running_mean", router_replay=replay)
    trainer = SAOTrainer(policy, None, config)  # fp32 masters, bf16 autocast
    train_mode(policy)
    batch = build_batch(trajectories)
    logp = torch.zeros(batch.input_ids.shape)
    with torch.no_grad():
        for rows in micro_batches(batch, config.max_tokens_per_microbatch):
            mb = pack(batch, rows)
            with trainer._routing(mb):
                mb.scatter(trainer._logprobs(mb)[0], logp)
    log_r = (logp - batch.logp_rollout)[batch.action_mask].double()
    lower, upper = math.log1p(-config.eps_low), math.log1p(config.eps_high)
    diff = log_r.abs()
    agree, choices = trainer.replay.agreement()
    return {"p50": diff.quantile(0.5).item(), "p99": diff.quantile(0.99).item(), "max": diff.max().item(),
            "masked": ((log_r <= lower) | (log_r >= upper)).double().mean().item(),
            "agreement": agree / choices}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replies", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    model = ensure_test_model(ROOT / ".cache" / "sao", "moe")
    trajectories = sample(model, args.replies, args.tokens, args.seed)
    n = sum(t.num_action_tokens for t in trajectories)
    print(f"engine: hf, bf16, {len(trajectories)} replies, {n} sampled tokens ({time.perf_counter() - t0:.0f}s)")
    off, on = measure(model, trajectories, "off"), measure(model, trajectories, "on")
    for name, m in (("replay off", off), ("replay on", on)):
        print(f"{name:10s}  |log r| p50 {m['p50']:.4f}  p99 {m['p99']:.4f}  max {m['max']:.4f}  "
              f"DIS-masked {100 * m['masked']:.2f}%  route agreement {100 * m['agreement']:.2f}%")
    print(f"mismatch: |log r| p99 {off['p99']:.4f} -> {on['p99']:.4f}, max {off['max']:.4f} -> {on['max']:.4f}, "
          f"masked {100 * off['masked']:.2f}% -> {100 * on['masked']:.2f}%, route agreement "
          f"{100 * off['agreement']:.2f}% (replay off -> on)")


if __name__ == "__main__":
    main()
