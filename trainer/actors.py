"""The Ray actors of `sao train`: the engine (with its proxy), the task feed and the rollout workers.

- `EngineActor`: hosts the inference engine (`hf` on CPU, `vllm` on GPUs, or the simulated
  `SleepEngine`) and the token-exact proxy on loopback. Rollout workers on the same node talk HTTP
  to the proxy; `close_episode` and `update_weights` are Ray calls. It meters the engine: busy time
  is wall time with at least one request in flight.
- `TaskFeed`: hands out tasks. It cycles through the tasks, one rollout per task per pass, each pass
  shuffled with the run seed. Async mode: the next task of the cycle, always (workers never wait).
  Sync mode: a round of B/G tasks x G rollouts, opened by the trainer after it published the new
  weights; between rounds it hands out nothing (workers idle through the update).
- `RolloutWorker`: runs episodes one after the other (`run_episode` for `env=swe`, the simulated
  environment for `env=simulated`) and writes every finished trajectory, at once, to the trace
  store. An infra error is stored (never as a reward) and retried up to `rollout.max_retries` times.

Every Ray call made here has a timeout (`trainer.actor_timeout_s`).
"""
from __future__ import annotations

import os
import random
import threading
import time
from typing import Any

import ray

from harness.trace import Trajectory

# --- the engine -----------------------------------------------------------------------------------


class _Metered:
    """Wraps an engine; accumulates the wall time during which at least one `generate` is in flight."""

    def __init__(self, engine):
        self._engine = engine
        self._lock = threading.Lock()
        self._inflight = 0
        self._since = time.monotonic()
        self._busy = 0.0
        self.started = time.monotonic()

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def _tick(self, delta: int) -> None:
        with self._lock:
            now = time.monotonic()
            if self._inflight > 0:
                self._busy += now - self._since
            self._since = now
            self._inflight += delta

    def generate(self, prompt_ids, sampling, timeout=None):
        self._tick(+1)
        try:
            return self._engine.generate(prompt_ids, sampling, timeout)
        finally:
            self._tick(-1)

    def busy_s(self) -> float:
        self._tick(0)
        return self._busy


@ray.remote(num_cpus=0)
class EngineActor:
    """The engine and its proxy (on 127.0.0.1, a free port). `cfg.model.path` is a resolved local path."""

    def __init__(self, cfg, version: int = 0):
        from transformers import AutoTokenizer

        from harness.proxy import ProxyServer

        tc = cfg.trainer
        tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
        if tc.env == "simulated" and tc.sim_engine_s is not None:
            from trainer.simulated import SleepEngine

            engine = SleepEngine(tc.sim_engine_s, len(tokenizer), tokenizer.eos_token_id, seed=cfg.run.seed,
                                 timeout_s=cfg.engine.timeout_s)
        else:
            from harness.engines import make_engine

            engine = make_engine(cfg)
        if version:
            engine.update_weights(version, {})  # resumed: the checkpoint's weights carry this version
        self.engine = _Metered(engine)
        self.proxy = ProxyServer(self.engine, tokenizer, cfg)
        self.url = self.proxy.start(host="127.0.0.1", port=0)

    def base_url(self) -> str:
        return self.url

    def serve(self) -> None:
        """Blocks while the engine lives: the driver holds this call's ref, which fails when the actor dies."""
        threading.Event().wait()

    def node_id(self) -> str:
        """The Ray node this engine runs on: rollout workers are placed there (the proxy is loopback only)."""
        return ray.get_runtime_context().get_node_id()

    def close_episode(self, episode_id: str) -> Trajectory | None:
        """The episode's trajectory, or None for an episode the proxy never served."""
        from harness.proxy import UnknownEpisode

        try:
            return self.proxy.close_episode(episode_id)
        except UnknownEpisode:
            return None

    def update_weights(self, version: int, weights: dict[str, Any], timeout: float | None = None) -> float:
        """Load `weights` (a state dict, from the object store) as policy `version`; return the seconds taken.
        Requests in flight continue on the new weights (the engine applies them between steps)."""
        t0 = time.monotonic()
        self.engine.update_weights(version, weights, timeout=timeout)
        return time.monotonic() - t0

    def stats(self) -> dict[str, float]:
        """Engine version, busy seconds (>= 1 request in flight) and seconds since it started serving."""
        return {"version": self.engine.version, "busy_s": self.engine.busy_s(),
                "up_s": time.monotonic() - self.engine.started, "open_episodes": len(self.proxy.sessions)}


class RemoteProxy:
    """What an episode needs of the proxy (`base_url`, `close_episode`), for a worker in another process."""

    def __init__(self, base_url: str, engine, timeout_s: float):
        self.base_url, self._engine, self._timeout = base_url, engine, timeout_s

    def close_episode(self, episode_id: str) -> Trajectory:
        from harness.proxy import UnknownEpisode

        traj = ray.get(self._engine.close_episode.remote(episode_id), timeout=self._timeout)
        if traj is None:
            raise UnknownEpisode(episode_id)
        return traj


# --- the task feed --------------------------------------------------------------------------------


@ray.remote(num_cpus=0)
class TaskFeed:
    """Assignments for rollout workers: `{"task", "assignment", "round", "group"}` or None (wait).

    `position` counts tasks taken from the cycle (a checkpoint saves it); pass p of the cycle is the
    task list shuffled with `random.Random(f"{seed}:{p}")`.
    """

    def __init__(self, tasks: list, seed: int, mode: str, group_size: int, groups_per_round: int, session: str,
                 position: int = 0):
        if not tasks:
            raise ValueError("TaskFeed: no tasks")
        self.tasks, self.seed, self.mode = tasks, seed, mode
        self.group_size, self.groups_per_round, self.session = group_size, groups_per_round, session
        self.position = position
        self.handed = 0  # assignments handed out by this feed
        self.queue: list[dict] = []  # sync: the open round's assignments not handed out yet
        self.inflight: dict[str, dict] = {}  # worker id -> its current assignment

    def _next_task(self):
        n = len(self.tasks)
        order = list(range(n))
        random.Random(f"{self.seed}:{self.position // n}").shuffle(order)
        task = self.tasks[order[self.position % n]]
        self.position += 1
        return task

    def next(self, worker_id: str) -> dict | None:
        """The worker's next assignment (its previous one is done), or None: nothing to do now."""
        self.inflight.pop(worker_id, None)
        if self.queue:
            item = self.queue.pop(0)
        elif self.mode == "async":
            item = {"task": self._next_task(), "round": None, "group": None}
        else:
            return None
        item = {**item, "assignment": f"{self.session}:{self.handed}"}
        self.handed += 1
        self.inflight[worker_id] = item
        return item

    def open_round(self, round_id: str) -> list[str]:
        """Sync mode: the next round, `groups_per_round` tasks x `group_size` rollouts; their task ids."""
        if self.queue:
            raise RuntimeError(f"TaskFeed: round opened while {len(self.queue)} assignments of the last are pending")
        ids = []
        for g in range(self.groups_per_round):
            task = self._next_task()
            ids.append(task.instance_id)
            self.queue.extend({"task": task, "round": round_id, "group": g} for _ in range(self.group_size))
        return ids

    def release(self, worker_id: str) -> bool:
        """A worker died: its assignment goes back to the front of the queue (sync) or is dropped (async)."""
        item = self.inflight.pop(worker_id, None)
        if item is not None and item["round"] is not None:
            self.queue.insert(0, {k: item[k] for k in ("task", "round", "group")})
            return True
        return False

    def state(self) -> dict:
        return {"position": self.position, "handed": self.handed, "queued": len(self.queue),
                "inflight": len(self.inflight)}


# --- rollout workers ------------------------------------------------------------------------------


@ray.remote(num_cpus=0, max_concurrency=2)
class RolloutWorker:
    """Runs episodes until `stop()`; `run()` returns a summary (or raises: the driver reports it)."""

    def __init__(self, worker_id: str, cfg, engine, feed, run_id: str):
        self.worker_id, self.cfg, self.engine, self.feed, self.run_id = worker_id, cfg, engine, feed, run_id
        self._stop = threading.Event()
        self.current: str | None = None
        self.episodes = 0
        self.infra_errors = 0
        self.started = time.time()

    def stop(self) -> None:
        self._stop.set()

    def status(self) -> dict:
        return {"worker": self.worker_id, "pid": os.getpid(), "current": self.current, "episodes": self.episodes,
                "infra_errors": self.infra_errors}

    def run(self) -> dict:
        from harness.episode import EpisodeContext, new_episode_id
        from harness.store import TraceStore

        cfg = self.cfg
        timeout = cfg.trainer.actor_timeout_s
        if cfg.trainer.env == "swe":
            from harness.episode import run_episode as episode_fn
        else:
            from trainer.simulated import run_simulated_episode as episode_fn
        base_url = ray.get(self.engine.base_url.remote(), timeout=timeout)
        ctx = EpisodeContext(cfg=cfg, proxy=RemoteProxy(base_url, self.engine, timeout), run_id=self.run_id, grade=True)
        store = TraceStore(cfg.run.dir)
        while not self._stop.is_set():
            item = ray.get(self.feed.next.remote(self.worker_id), timeout=timeout)
            if item is None:  # sync mode between rounds: idle until the trainer opens the next one
                self._stop.wait(0.02)
                continue
            task = item["task"]
            for attempt in range(cfg.rollout.max_retries + 1):
                if self._stop.is_set():
                    break
                eid = new_episode_id(task.instance_id)
                self.current = eid
                t_start = time.time()
                try:
                    traj = episode_fn(task, ctx, eid)
                except Exception as e:  # run_episode never raises; anything here is infrastructure
                    traj = Trajectory(task_id=task.instance_id, traj_id=eid, status="infra_error",
                                      metadata={"infra_error": f"{type(e).__name__}: {e}"})
                last = traj.status != "infra_error" or attempt == cfg.rollout.max_retries
                traj.metadata.update(worker=self.worker_id, assignment=item["assignment"], round=item["round"],
                                     group=item["group"], attempt=attempt, last_attempt=last,
                                     t_start=t_start, t_end=time.time())
                store.write([traj])  # a failure here (disk) ends the worker: the driver reports it
                self.episodes += 1
                self.infra_errors += traj.status == "infra_error"
                self.current = None
                if last:
                    break
        return self.status()
