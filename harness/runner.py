"""Which function runs an episode (`env name -> episode function`), and the one infra-retry loop.

An episode function is `fn(task, ctx, episode_id) -> Trajectory` (`ctx`: `harness.episode.EpisodeContext`)
and follows the contract of `harness.episode.run_episode`: it never raises for what goes wrong inside
the episode; the trajectory's status says how it ended, and an `infra_error` has no reward, ever.

- `EPISODES`: `swe` (OpenHands in Docker) is registered here; a layer above adds its own envs with
  `register_episode(name, fn)` (the trainer registers `simulated` and `toy`).
- `run_with_retries`: at most `1 + max_retries` attempts, a new episode id each; it stops at the first
  attempt that is not an infra error. An exception out of the episode function counts as an infra
  error (the contract says it never raises: what escapes is infrastructure).
"""
from __future__ import annotations

import time
from collections.abc import Callable

from core.errors import UserError
from harness.episode import INFRA_ERROR, EpisodeContext, new_episode_id, run_episode
from harness.trace import Trajectory

EpisodeFn = Callable[[object, EpisodeContext, str], Trajectory]

EPISODES: dict[str, EpisodeFn] = {"swe": run_episode}


def register_episode(env: str, fn: EpisodeFn) -> EpisodeFn:
    """Make `fn` the episode function of `trainer.env=<env>`; returns `fn`."""
    EPISODES[env] = fn
    return fn


def episode_function(env: str) -> EpisodeFn:
    try:
        return EPISODES[env]
    except KeyError:
        raise UserError(f"trainer.env={env!r}: no episode function for it (known: {', '.join(sorted(EPISODES))})") \
            from None


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
            traj = Trajectory(task_id=task.instance_id, traj_id=eid, status=INFRA_ERROR,
                              metadata={"infra_error": f"{type(e).__name__}: {e}"})
        last = traj.status != INFRA_ERROR or attempt == max_retries
        traj.metadata.update(attempt=attempt, last_attempt=last, t_start=t_start, t_end=time.time())
        if on_attempt is not None:
            on_attempt(traj)
        if last:
            break
    return traj
