"""The env registry (`trainer.env` -> `EnvSpec`, the one place an env says what it is) and the one infra-retry loop.

An env's episode function is `fn(task, ctx, episode_id) -> Trajectory` (`ctx`: `harness.episode.EpisodeContext`)
and follows the contract of `harness.episode.run_episode`: it never raises for what goes wrong inside
the episode; the trajectory's status says how it ended, and an `infra_error` has no reward, ever.

- `ENVS`: the envs of `trainer.env`: `swe` (OpenHands in Docker, harness.episode) and the test-beds
  `simulated`, `toy` and `chain` (harness.testbeds). A spec names its functions as `"module:function"`,
  imported on first use, so that validating `trainer.env` loads neither the agent nor the proxy. A layer
  above adds its own with `register_env(EnvSpec(...))`.
- `load_tasks`: the tasks of `tasks.source` an env runs, loaded and pre-flighted once (`sao train`).
- `run_with_retries`: at most `1 + max_retries` attempts, a new episode id each; it stops at the first
  attempt that is not an infra error. An exception out of the episode function counts as an infra
  error (the contract says it never raises: what escapes is infrastructure), its kind from its type
  (`harness.infra.error_kind`).
"""
from __future__ import annotations

import contextlib
import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sao_harness.core.errors import UserError
from sao_harness.tasks.formats.loaders import tasks_from_config
from sao_harness.tasks.preflight import preflight

if TYPE_CHECKING:
    from sao_harness.harness.episode import EpisodeContext
    from sao_harness.harness.trace import Trajectory
    from sao_harness.tasks.model import Task

EpisodeFn = Callable[[object, "EpisodeContext", str], "Trajectory"]


def _imported(fn: Callable | str) -> Callable:
    """`fn`, or the function a `"module:function"` names (imported now)."""
    if not isinstance(fn, str):
        return fn
    module, _, name = fn.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class EnvSpec:
    """`trainer.env: <name>`: its episode function and what a run of it needs before, around and instead."""

    name: str
    episode: EpisodeFn | str  # the episode function, or "module:function"
    summary: str  # one line for the docs
    preflight: bool = False  # graded tasks in Docker: tasks.preflight before anything starts, a tool-calling template
    prepare: Callable | str | None = None  # fn(cfg, tasks, log) -> the tasks it runs, ready for a first episode
    scope: Callable | str | None = None  # fn(run_id) -> the context a run lives in (swe: its sandboxes removed)
    stand_in: Callable[[Any], str | None] | None = None  # fn(cfg) -> the engine it runs instead of engine.kind's
    stand_in_engine: Callable | str | None = None  # fn(cfg, tokenizer) -> that engine

    def episode_fn(self) -> EpisodeFn:
        """The episode function (a `"module:function"` imported now)."""
        return _imported(self.episode)

    def prepared(self, cfg, tasks: list[Task], log=print) -> list[Task]:
        """The tasks this env runs, ready for their first episode (`prepare`); a UserError when none is left."""
        ready = _imported(self.prepare)(cfg, tasks, log) if self.prepare is not None else tasks
        if not ready:
            raise UserError(f"no runnable tasks from tasks.source={cfg.tasks.source!r}")
        return ready

    def run_scope(self, run_id: str) -> contextlib.AbstractContextManager:
        """The context one run of this env lives in (none: a null context)."""
        return _imported(self.scope)(run_id) if self.scope is not None else contextlib.nullcontext()

    def stand_in_name(self, cfg) -> str | None:
        """The engine this env runs under `cfg` instead of `engine.kind`'s, by name; None: `engine.kind`'s."""
        return self.stand_in(cfg) if self.stand_in is not None else None

    def make_stand_in(self, cfg, tokenizer):
        """The stand-in engine under `cfg` (`stand_in_name`), or None: `engine.kind`'s engine generates."""
        return _imported(self.stand_in_engine)(cfg, tokenizer) if self.stand_in_name(cfg) else None


ENVS: dict[str, EnvSpec] = {}


def register_env(spec: EnvSpec) -> EnvSpec:
    """Add `spec` under `spec.name`; a name registered already is an error."""
    if spec.name in ENVS:
        raise ValueError(f"env {spec.name!r} is registered already ({ENVS[spec.name].episode})")
    ENVS[spec.name] = spec
    return spec


def check_env(env: str) -> str:
    """`env` if it is registered; else a ValueError listing the known envs (config validation)."""
    if env not in ENVS:
        raise ValueError(f"unknown env {env!r} (known: {', '.join(sorted(ENVS))})")
    return env


def env_spec(env: str) -> EnvSpec:
    """The spec of `env`; a UserError listing the known envs for any other."""
    try:
        return ENVS[env]
    except (KeyError, TypeError):
        raise UserError(f"trainer.env={env!r}: no episode function for it (known: {', '.join(sorted(ENVS))})") from None


def episode_function(env: str) -> EpisodeFn:
    """The episode function of `env` (`env_spec(env).episode_fn()`)."""
    return env_spec(env).episode_fn()


def load_tasks(cfg, env: str, log=print) -> list[Task]:
    """The tasks of `tasks.source` for the env named `env`, loaded once: with its `preflight`, those
    tasks.preflight passes (its UserError otherwise); else those that validate (the others logged and skipped)."""
    tasks, errors = tasks_from_config(cfg)
    if env_spec(env).preflight:  # before torch loads and the first episode: usable tasks only
        return preflight(cfg, tasks, errors, log=log)
    for e in errors:
        log(f"skipping a task that does not validate: {e}")
    return tasks


# --- the envs -------------------------------------------------------------------------------------


def swe_images(cfg, tasks: list[Task], log=print) -> list[Task]:
    """`swe`'s tasks with an image, their images built or present (from a task repo, never pulled)."""
    from sao_harness.envs.engine import ensure_engine  # lazy: docker-py; validating trainer.env needs none
    from sao_harness.tasks.images.prepare import prepare_task_images  # lazy: docker-py and the image builder, as above

    tasks = [t for t in tasks if t.image]
    if tasks:
        prepare_task_images(cfg, ensure_engine(cfg.docker), cfg.tasks.source, tasks, pull=False, log=log)
    return tasks


def sleep_engine_name(cfg) -> str | None:
    """`simulated` with `testbed.simulated.engine_s`: the sleep engine stands in (harness.engines.sleep)."""
    return "sleep (simulated)" if cfg.testbed.simulated.engine_s is not None else None


register_env(EnvSpec("swe", "sao_harness.harness.episode:run_episode", "OpenHands in a Docker sandbox, graded",
                     preflight=True, prepare=swe_images, scope="sao_harness.envs.gc:run_scope"))
register_env(EnvSpec("simulated", "sao_harness.harness.testbeds.simulated:run_simulated_episode",
                     "real generations, sleeps (tests, bench)", stand_in=sleep_engine_name,
                     stand_in_engine="sao_harness.harness.testbeds.simulated:sleep_engine"))
register_env(EnvSpec("toy", "sao_harness.harness.testbeds.toy:run_toy_episode", "the learning test-bed"))
register_env(EnvSpec("chain", "sao_harness.harness.testbeds.chain:run_chain_episode", "the long-horizon test-bed"))


# --- retries --------------------------------------------------------------------------------------

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
    from sao_harness.harness.episode import new_episode_id  # lazy: loads the agent; config validation imports ENVS
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
