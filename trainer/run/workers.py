"""The engine replicas and rollout workers of `sao train`, seen from the trainer: started, watched, replaced.

`EngineReplicas` (`engine.replicas` engine actors, `runtime.weight_sync`):
- `start(version)`: N `EngineActor`s named `r0..r<N-1>` (Ray places them: `engine.gpus_per_replica`,
  `engine.node_resources`), each announced to the task feed, which routes every episode to the
  least-loaded one.
- `check()`: a replica that died is reported, withdrawn from the feed (its episodes end as infra
  errors in their workers), and replaced (`r0.1`, ...), the replacement brought to the current weights
  before it serves (`LoopError` after `3 x engine.replicas` deaths).
- `publish(version, weights)`: dead replicas replaced first, then the weights to every replica; a
  replica that dies during it is replaced and the publish done again; a `LoopError` naming the one that
  failed otherwise; the step ends only when all serve `version`.

`WorkerPool`:
- `start(n)`: n `RolloutWorker`s, on the nodes with `rollout.node_resources` when set, else on a
  replica's node (worker i on replica i mod N's: loopback proxies are reachable there).
- `check()`: replicas are checked; a worker whose `run()` returned or raised died: it is
  reported, the episode it ran is stored as an `infra_error` (no reward), its task goes back to the
  feed (sync: always; async: within `rollout.max_retries`, `TaskFeed.release`), and it is replaced
  (`LoopError` after `3 x rollout.workers` deaths); episodes that all end in infra errors end the run
  too, and so does a worker the trace store refused (`TraceWriteError`, a full disk: at once).
- `next_batch(...)`: blocks until the queue holds a batch, checking the workers meanwhile;
  `LoopError` when no trajectory arrives for `runtime.batch_timeout_s`, or when the run's share of
  infra errors is over `rollout.max_infra_frac` (`trainer.run.queue.over_infra_limit`: the kinds listed).
- `stop()`: kills the workers and lets them be gone (before the engine goes, or they would store
  engine failures); episodes in flight are abandoned, never stored.
"""
from __future__ import annotations

import time

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from sao_harness.harness.engines.registry import replica_gpus
from sao_harness.harness.engines.vllm_env import engine_runtime_env
from sao_harness.harness.episode import new_episode_id
from sao_harness.harness.store import TraceStore, TraceWriteError
from sao_harness.harness.trace import Status, Trajectory
from sao_harness.trainer.run.actors import EngineActor, RolloutWorker
from sao_harness.trainer.run.queue import Counters, Entry, TraceQueue, over_infra_limit, take_async, take_round
from sao_harness.trainer.run.ray_utils import LoopError, get, is_done


def _error(ref) -> BaseException | None:
    """What the finished call behind `ref` raised (the original exception, not Ray's wrapper), or None."""
    try:
        ray.get(ref, timeout=0)
    except Exception as e:  # noqa: BLE001  (RayActorError: the process died; RayTaskError: what run() raised)
        return getattr(e, "cause", None) or e
    return None


def _why(ref) -> str:
    """Why the call behind `ref` ended: what it returned, or its error's last line."""
    try:
        return f"run() returned {ray.get(ref)}"
    except Exception as e:  # noqa: BLE001  (RayActorError: the process died; or what the call raised)
        return f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"


class EngineReplicas:
    """The engine replicas of `cfg` (the run config each replica gets: its engine, proxy and model.path); `weights()`
    -> (version, state dict) gives a replacement the current weights."""

    def __init__(self, cfg, feed, sync, *, session: str, counters: Counters, weights=None, tasks=None, log=print):
        self.cfg, self.feed, self.sync, self.tasks = cfg, feed, sync, tasks  # tasks: for an engine that serves them
        self.session, self.counters, self.weights, self.log = session, counters, weights, log
        self.timeout, self.publish_timeout = cfg.runtime.actor_timeout_s, cfg.runtime.publish_timeout_s
        self.actors: dict[str, object] = {}  # replica name -> actor, in rank order
        self.alive: dict[str, object] = {}  # replica name -> the ref of its serve(): fails when it dies
        self.infos: dict[str, dict] = {}  # replica name -> {"url", "node_ip", "node_id"}
        self.last_stats: dict[str, dict] = {}
        self.retired = {"busy_s": 0.0, "up_s": 0.0}  # dead replicas' last-known meters

    def _options(self, name: str) -> dict:
        ec = self.cfg.engine
        gpus = replica_gpus(ec)
        opts = {"max_concurrency": self.cfg.rollout.workers + 8, "name": f"sao-engine-{self.session}-{name}"}
        if gpus:
            opts["num_gpus"] = gpus
        if ec.node_resources:
            opts["resources"] = dict(ec.node_resources)
        runtime_env = engine_runtime_env(ec)  # vllm from its own venv (.venv-vllm): harness.engines.vllm_env
        if runtime_env:
            opts["runtime_env"] = runtime_env
        return opts

    def start(self, version: int) -> None:
        """All replicas, serving `version` (the weights of `cfg.model.path`)."""
        names = [f"r{i}" for i in range(self.cfg.engine.replicas)]
        for name in names:
            self.actors[name] = EngineActor.options(**self._options(name)).remote(self.cfg, version, self.tasks)
        for name in names:
            self._serve(name)
        self.sync.connect(self.actors)

    def _serve(self, name: str) -> None:
        actor = self.actors[name]
        self.infos[name] = info = get(actor.info.remote(), self.timeout, f"starting engine replica {name}")
        self.alive[name] = actor.serve.remote()
        get(self.feed.add_replica.remote(name, actor, info["url"], info["node_ip"]), self.timeout, "the task feed")

    def check(self) -> None:
        """Report, withdraw and replace every replica that died (see the module doc)."""
        dead = [name for name, ref in self.alive.items() if is_done(ref)]
        if not dead:
            return
        for name in dead:
            self.counters.count("engine_deaths")
            self.log(f"engine replica {name} died ({_why(self.alive[name])}); its episodes end as infra errors; "
                     f"replacing it")
            get(self.feed.remove_replica.remote(name), self.timeout, "the task feed")
            ray.kill(self.actors.pop(name))
            del self.alive[name], self.infos[name]
            stats = self.last_stats.pop(name, None)
            if stats:
                self.retired = {k: self.retired[k] + stats[k] for k in self.retired}
        if self.counters.engine_deaths > 3 * self.cfg.engine.replicas:
            raise LoopError(f"{self.counters.engine_deaths} engine replica deaths; the last: {dead[-1]}")
        version, weights = self.weights()
        new = []
        for name in dead:
            fresh = f"{name.split('.')[0]}.{self.counters.engine_deaths}"
            self.actors[fresh] = EngineActor.options(**self._options(fresh)).remote(self.cfg, 0, self.tasks)
            new.append(fresh)
        for name in new:
            get(self.actors[name].info.remote(), self.timeout, f"starting engine replica {name}")
        if version:  # the replacements load the current weights before they serve
            self.sync.publish(self.actors, version, weights, self.publish_timeout)
        else:
            self.sync.connect(self.actors)
        for name in new:
            self._serve(name)
            self.log(f"engine replica {name} serving policy version {version} at {self.infos[name]['url']}")

    def publish(self, version: int, weights: dict) -> dict:
        """`weights` as `version` on every replica (dead ones replaced first); seconds per replica. A replica
        that dies during the publish is replaced too, and the publish is done again on the new set."""
        self.check()
        try:
            return self.sync.publish(self.actors, version, weights, self.publish_timeout)
        except LoopError as e:
            if not self._one_died(wait_s=10.0):
                raise
            self.log(f"{e}; the replica died meanwhile: replacing it and publishing again")
            self.check()
            return self.sync.publish(self.actors, version, weights, self.publish_timeout)

    def _one_died(self, wait_s: float) -> bool:
        """Whether a replica's serve() has ended (it only does when the replica died), waiting up to `wait_s`."""
        ready, _ = ray.wait(list(self.alive.values()), num_returns=1, timeout=wait_s)
        return bool(ready)

    def stats(self) -> dict[str, float]:
        """Over the replicas: the oldest version, busy and up seconds summed (dead ones' last-known included)."""
        refs = {name: a.stats.remote() for name, a in self.actors.items()}
        for name, ref in refs.items():
            try:
                self.last_stats[name] = ray.get(ref, timeout=self.timeout)
            except Exception as e:  # noqa: BLE001  (a replica dying now: check() replaces it)
                self.log(f"engine replica {name}: no stats ({type(e).__name__})")
        live = [self.last_stats[n] for n in self.actors if n in self.last_stats]
        if not live:
            raise LoopError("engine stats: no replica answered")
        return {"version": min(s["version"] for s in live),
                "busy_s": self.retired["busy_s"] + sum(s["busy_s"] for s in live),
                "up_s": self.retired["up_s"] + sum(s["up_s"] for s in live)}

    def stop(self) -> None:
        self.sync.close()
        for a in self.actors.values():
            ray.kill(a)


class WorkerPool:
    """The rollout workers; `cfg` is the run config their episodes read (harness.runner's episode functions)."""

    def __init__(self, cfg, engines: EngineReplicas, feed, *, session: str, run_id: str, counters: Counters,
                 log=print):
        self.cfg, self.engines, self.feed = cfg, engines, feed
        self.session, self.run_id, self.counters, self.log = session, run_id, counters, log
        self.timeout = cfg.runtime.actor_timeout_s
        self.workers: dict[str, object] = {}  # worker id -> actor
        self.runs: dict[str, object] = {}  # worker id -> the ref of its run()
        self.started = 0

    def start(self, n: int) -> None:
        need = self.cfg.rollout.node_resources
        if need:
            have = ray.cluster_resources()
            missing = [k for k, v in need.items() if have.get(k, 0) < v]
            if missing:
                raise LoopError(f"rollout.node_resources {dict(need)}: no Ray node declares {', '.join(missing)} "
                                f"(start the sandbox nodes with `ray start --resources '{{\"{missing[0]}\": N}}'`)")
        for i in range(n):
            self._start_worker(f"w{i}")

    def _placement(self) -> dict:
        if self.cfg.rollout.node_resources:
            return {"resources": dict(self.cfg.rollout.node_resources)}
        nodes = [info["node_id"] for info in self.engines.infos.values()]
        node = nodes[self.started % len(nodes)]
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}

    def _start_worker(self, wid: str) -> None:
        w = RolloutWorker.options(name=f"sao-worker-{self.session}-{wid}", **self._placement()).remote(
            wid, self.cfg, self.feed, self.run_id)
        self.started += 1
        self.workers[wid], self.runs[wid] = w, w.run.remote()

    def check(self) -> None:
        """Replace dead replicas and workers; raise `LoopError` for an infra-error streak or too many deaths."""
        counters, batch_size = self.counters, self.cfg.trainer.batch_size
        self.engines.check()
        if counters.infra_streak >= max(20, 3 * batch_size):
            raise LoopError(f"{counters.infra_streak} infra errors in a row and no usable trajectory; the last: "
                            f"{counters.last_infra_error}")
        ready, _ = ray.wait(list(self.runs.values()), num_returns=len(self.runs), timeout=0)
        for wid in [w for w, r in self.runs.items() if r in ready]:
            why = _why(self.runs[wid])
            counters.count("worker_deaths")
            cause = _error(self.runs[wid])
            if isinstance(cause, TraceWriteError):  # a replacement could not write either: stop, say so
                raise LoopError(f"rollout worker {wid}: {cause}; `sao train` resumes from the last checkpoint")
            self.log(f"rollout worker {wid} died ({why}); replacing it")
            if counters.worker_deaths > 3 * self.cfg.rollout.workers:
                raise LoopError(f"{counters.worker_deaths} rollout worker deaths; the last: {wid}: {why}")
            item = get(self.feed.release.remote(wid, self.cfg.rollout.max_retries), self.timeout,
                       "giving a dead worker's task back")
            if item is not None:
                self._store_abandoned(wid, why, item)
            ray.kill(self.workers.pop(wid))
            del self.runs[wid]
            self._start_worker(f"{wid}.r{counters.worker_deaths}")

    def _store_abandoned(self, wid: str, why: str, item: dict) -> None:
        """The episode a dead worker was running: an `infra_error` in the store (no reward, counted when the
        queue reaches it), retried (`last_attempt` False) when the feed put its task back (`TaskFeed.release`)."""
        task_id = item["task"].instance_id
        traj = Trajectory(task_id=task_id, traj_id=new_episode_id(task_id), status=Status.INFRA_ERROR, metadata={
            Status.INFRA_ERROR: f"rollout worker {wid} died during the episode: {why}", "worker": wid,
            "assignment": item["assignment"], "round": item["round"], "group": item["group"],
            "attempt": item["deaths"] - 1, "last_attempt": not item["requeued"], "t_end": time.time()})
        try:
            TraceStore(self.cfg.run.dir).write([traj])
        except TraceWriteError as e:
            raise LoopError(f"{e}; `sao train` resumes from the last checkpoint") from e
        self.log(f"rollout worker {wid}'s episode of {task_id}: infra_error"
                 + ("; its task runs again" if item["requeued"] else ""))

    def report(self) -> str:
        """One line: each worker's episodes and what it runs now."""
        try:
            st = ray.get([w.status.remote() for w in self.workers.values()], timeout=10)
            return "; ".join(f"{s['worker']}: {s['episodes']} episodes, running {s['current']}" for s in st)
        except Exception as e:  # noqa: BLE001  (a report, never a reason to stop)
            return f"(worker status unavailable: {type(e).__name__})"

    def next_batch(self, queue: TraceQueue, version: int, round_id: str) -> list[Entry]:
        """Block until a batch is ready (async: `take_async`; sync: `take_round` of `round_id`)."""
        tc, rt = self.cfg.trainer, self.cfg.runtime
        last_new = time.monotonic()
        while True:
            self.check()
            if queue.poll():
                last_new = time.monotonic()
            if tc.mode == "async":
                batch = take_async(queue, self.counters, tc.batch_size, version, tc.max_staleness)
            else:
                batch = take_round(queue, self.counters, round_id, tc.batch_size)
            if why := over_infra_limit(queue, self.counters, self.cfg.rollout.max_infra_frac, tc.batch_size):
                raise LoopError(why)  # the stored traces stay; a resumed run replays from the last checkpoint
            if batch is not None:
                return batch
            if time.monotonic() - last_new > rt.batch_timeout_s:
                raise LoopError(f"waiting for a batch of {tc.batch_size}: no new trajectory in "
                                f"{rt.batch_timeout_s:g}s (runtime.batch_timeout_s); {len(queue.pending)} pending; "
                                f"workers: {self.report()}")
            time.sleep(rt.poll_interval_s)

    def stop(self) -> None:
        for w in self.workers.values():
            ray.kill(w)
        if self.runs:
            ray.wait(list(self.runs.values()), num_returns=len(self.runs), timeout=30)
