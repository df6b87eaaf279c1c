"""The simulated test-bed (`trainer.env: simulated`): what the tests and the benchmark run instead of Docker.

An episode is an OpenHands episode without the sandbox: real engine generations through the proxy
(HTTP, `X-Episode-Id`), a system and a user message, then per turn one chat completion, a sleep of
`testbed.simulated.env_sleep_s` (the "tool execution") and a synthetic observation message. Its number
of turns is drawn from LogNormal(log(turns_median), turns_sigma) clipped to [1, turns_max], seeded by
the episode id. The trajectory is the proxy's (`close_episode`), so it is token-exact and
carries the version of every sampled token, exactly as in `env=swe`.

- Reward (deterministic): the fraction of the episode's action tokens whose id is even.
- Infra errors: an HTTP failure, or one injected with probability `infra_error_rate` (seeded by
  the episode id: it stops after its first turn). Status `infra_error`, no reward, never a 0.
- `harness.engines.sleep.SleepEngine` (`engine_s`): a stand-in engine that sleeps per call and samples uniformly, so
  that the benchmark measures the pipeline (workers, engine, trace store, trainer, weight publishing),
  not the model.
"""
from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from sao_harness.harness.engines.sleep import SleepEngine
from sao_harness.harness.proxy import UnknownEpisode
from sao_harness.harness.trace import REWARDED, Status, Trajectory

SYSTEM = "You are a coding agent working in a simulated environment. Reply with your next step."


def episode_turns(rng: random.Random, median: float, sigma: float, max_turns: int) -> int:
    """Turns of one episode: LogNormal(log(median), sigma), rounded and clipped to [1, max_turns]."""
    n = median if sigma == 0 else rng.lognormvariate(math.log(median), sigma)
    return max(1, min(max_turns, round(n)))


def reward_rule(traj: Trajectory) -> float:
    """The fraction of action tokens with an even id (0 without action tokens)."""
    ids = [t for s in traj.segments if s.kind == "action" for t in s.token_ids]
    return sum(t % 2 == 0 for t in ids) / len(ids) if ids else 0.0


def observation(turn: int, rng: random.Random) -> str:
    words = ["ok", "PASSED", "FAILED", "line", "def", "return", "import", "error", "test", "file"]
    return (f"[exit code {rng.randint(0, 1)}] turn {turn}: "
            + " ".join(rng.choice(words) for _ in range(rng.randint(3, 12))))


_client_lock = threading.Lock()
_client = None


def _http() -> httpx.Client:
    global _client
    with _client_lock:
        if _client is None:
            _client = httpx.Client(limits=httpx.Limits(max_keepalive_connections=8))
        return _client


def chat_episode(task, ctx, episode_id: str, messages: list[dict[str, Any]], turns: int,
                 observe: Callable[[int], str], reward: Callable[[Trajectory], float], env: str,
                 sleep_s: float = 0.0, inject_after_first: bool = False, **metadata) -> Trajectory:
    """A multi-turn episode through the proxy: `turns` chat completions; after turn t a sleep of
    `sleep_s` (the "tool execution") and the observation `observe(t)` as a user message (the last one
    is never sent); then the proxy's trajectory (token-exact), its status, and `reward(traj)` when the
    status is rewarded. Never raises for what goes wrong inside it: the status says how it ended."""
    cfg = ctx.cfg
    url = ctx.proxy.base_url.rstrip("/") + "/chat/completions"
    headers = {"X-Episode-Id": episode_id, "X-Task-Id": task.instance_id}
    if token := cfg.proxy.resolved_token():  # the proxy's bearer token, when one guards it
        headers["Authorization"] = f"Bearer {token}"
    status, error, t0 = Status.OK, None, time.monotonic()
    for turn in range(turns):
        try:
            r = _http().post(url, headers=headers, timeout=cfg.engine.timeout_s + 30,
                             json={"model": cfg.agent.model, "messages": messages,
                                   "max_tokens": cfg.sampling.max_tokens})
        except Exception as e:  # the proxy or the engine is gone: infrastructure
            status, error = Status.INFRA_ERROR, f"proxy request failed: {type(e).__name__}: {e}"
            break
        if r.status_code != 200:
            body = r.text[:300]
            if "context_length_exceeded" in body:
                status = Status.TRUNCATED_CONTEXT
            else:
                status, error = Status.INFRA_ERROR, f"proxy answered {r.status_code}: {body}"
            break
        messages.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"] or ""})
        if inject_after_first:
            status, error = Status.INFRA_ERROR, "injected by the test-bed (testbed.simulated.infra_error_rate)"
            break
        time.sleep(sleep_s)
        messages.append({"role": "user", "content": observe(turn)})
    try:
        traj = ctx.proxy.close_episode(episode_id)
    except UnknownEpisode:  # no turn was served
        traj = Trajectory(task_id=task.instance_id)
    traj.traj_id, traj.task_id = episode_id, task.instance_id
    if status == Status.OK and traj.status in (Status.TRUNCATED_CONTEXT, Status.INFRA_ERROR):
        status = traj.status  # the proxy saw it end that way
    traj.status, traj.reward = status, None
    if status in REWARDED:
        traj.reward = reward(traj)
    traj.metadata.update(env=env, run_id=ctx.run_id, **metadata)
    if error:
        traj.metadata[Status.INFRA_ERROR] = error
    traj.timings = {**traj.timings, "episode_s": time.monotonic() - t0}
    return traj.validate()


def run_simulated_episode(task, ctx, episode_id: str) -> Trajectory:
    """One simulated episode of `task` (`ctx`: `harness.episode.EpisodeContext`); never raises for what
    goes wrong inside it: the trajectory's status says how it ended (see the module doc)."""
    sim = ctx.cfg.testbed.simulated
    rng = random.Random(episode_id)
    planned = episode_turns(rng, sim.turns_median, sim.turns_sigma, sim.turns_max)
    inject = rng.random() < sim.infra_error_rate
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": task.problem_statement[:500] or task.instance_id}]
    return chat_episode(task, ctx, episode_id, messages, planned, lambda turn: observation(turn, rng), reward_rule,
                        "simulated", sleep_s=sim.env_sleep_s, inject_after_first=inject, planned_turns=planned)


def sleep_engine(cfg, tokenizer) -> SleepEngine:
    """The stand-in engine of `testbed.simulated.engine_s` (harness.runner's `simulated` spec): it sleeps that
    long per call and samples uniformly over the tokenizer's vocabulary."""
    return SleepEngine(cfg.testbed.simulated.engine_s, len(tokenizer), tokenizer.eos_token_id, seed=cfg.run.seed,
                       timeout_s=cfg.engine.timeout_s)
