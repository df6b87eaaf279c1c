"""Which function runs an episode (`env name -> episode function`), and the one infra-retry loop.

An episode function is `fn(task, ctx, episode_id) -> Trajectory` (`ctx`: `harness.episode.EpisodeContext`)
and follows the contract of `harness.episode.run_episode`: it never raises for what goes wrong inside
the episode; the trajectory's status says how it ended, and an `infra_error` has no reward, ever.

- `EPISODES`: the envs of `trainer.env`, each with its episode function or the `"module:function"`
  that holds it (imported on first use, so that validating `trainer.env` loads neither the agent nor
  the proxy): `swe` (OpenHands in Docker, harness.episode) and the test-beds `simulated`, `toy`
  and `chain` (harness.testbeds). A layer above adds its own with `register_episode(name, fn)`.
- `run_with_retries`: at most `1 + max_retries` attempts, a new episode id each; it stops at the first
  attempt that is not an infra error. An exception out of the episode function counts as an infra
  error (the contract says it never raises: what escapes is infrastructure), its kind from its type
  (`harness.infra.error_kind`).
"""
from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from sao_harness.core.errors import UserError

if TYPE_CHECKING:
    from sao_harness.harness.episode import EpisodeContext
    from sao_harness.harness.trace import Trajectory

EpisodeFn = Callable[[object, "EpisodeContext", str], "Trajectory"]

EPISODES: dict[str, EpisodeFn | str] = {
    "swe": "sao_harness.harness.episode:run_episode",  # OpenHands in a Docker sandbox, graded
    # real generations, sleeps (tests, bench)
    "simulated": "sao_harness.harness.testbeds.simulated:run_simulated_episode",
    "toy": "sao_harness.harness.testbeds.toy:run_toy_episode",  # the learning test-bed
    "chain": "sao_harness.harness.testbeds.chain:run_chain_episode",  # the long-horizon test-bed
}


def register_episode(env: str, fn: EpisodeFn) -> EpisodeFn:
    """Make `fn` the episode function of `trainer.env=<env>`; returns `fn`."""
    EPISODES[env] = fn
    return fn


def check_env(env: str) -> str:
    """`env` if it is registered; else a ValueError listing the known envs (config validation)."""
    if env not in EPISODES:
        raise ValueError(f"unknown env {env!r} (known: {', '.join(sorted(EPISODES))})")
    return env


def episode_function(env: str) -> EpisodeFn:
    """The episode function of `env` (a `"module:function"` entry imported now); a UserError for an unknown env."""
    try:
        fn = EPISODES[env]
    except KeyError:
        raise UserError(f"trainer.env={env!r}: no episode function for it (known: {', '.join(sorted(EPISODES))})") \
            from None
    if isinstance(fn, str):
        module, _, name = fn.partition(":")
        fn = EPISODES[env] = getattr(importlib.import_module(module), name)
    return fn


def run_with_retries(episode_fn: EpisodeFn, task, ctx: EpisodeContext, max_retries: int, *,
                     on_start: Callable[[str], None] | None = None,
                     on_attempt: Callable[[Trajectory], None] | None = None,
                     stop: Callable[[], bool] | None = None) -> Trajectory | None:
    """Run `task` until an attempt is not an infra error, at most `1 + max_retries` times; the last attempt.

    Every attempt's metadata gets `attempt`, `last_attempt` (False: an infra error that is retried),
    `t_start` and `t_end` (wall clock). `on_start(episode_id)` is called before each attempt,
    `on_attempt(traj)` after it (what it raises propagates); `stop()` true before an attempt ends the
    loop (None when no attempt ran).
    """
    from sao_harness.harness.episode import new_episode_id  # lazy: loads the agent; config validation imports EPISODES
    from sao_harness.harness.infra import error_kind  # lazy: pyarrow (harness.trace), as above
    from sao_harness.harness.trace import INFRA_KIND, Status, Trajectory  # lazy: pyarrow, as above

    traj = None
    for attempt in range(max_retries + 1):
        if stop is not None and stop():
            break
        eid = new_episode_id(task.instance_id)
        if on_start is not None:
            on_start(eid)
        t_start = time.time()
        try:
            traj = episode_fn(task, ctx, eid)
        except Exception as e:  # noqa: BLE001  (the contract says it never raises: this is infrastructure)
            traj = Trajectory(task_id=task.instance_id, traj_id=eid, status=Status.INFRA_ERROR,
                              metadata={Status.INFRA_ERROR: f"{type(e).__name__}: {e}", INFRA_KIND: error_kind(e)})
        last = traj.status != Status.INFRA_ERROR or attempt == max_retries
        traj.metadata.update(attempt=attempt, last_attempt=last, t_start=t_start, t_end=time.time())
        if on_attempt is not None:
            on_attempt(traj)
        if last:
            break
    return traj
