"""`sao train`: the asynchronous SAO loop, and the synchronous group baseline in the same code.

    this process: the trainer                            Ray actors (trainer.actors)
    --------------------------                           ---------------------------
    policy, critic, optimizers (fresh or resumed)        EngineActor   engine + proxy on 127.0.0.1
    start the actors ------------------------------->    TaskFeed      the task cycle (sync: rounds)
    until max_steps:                                     RolloutWorker x rollout.workers:
      batch   <- B finished trajectories, from the          task -> episode -> trace store, at once
                 trace store (the queue)
      update  =  SAOTrainer.update(batch): K critic steps + one policy step
      publish =  engine.update_weights(version + 1, state dict via the object store)
      metrics, progress line; checkpoint every save_every steps

- The queue is the trace store: shards not seen yet, trajectories not consumed yet, in stream order
  (`TraceQueue`). Consumed = trained, or excluded and counted: an unrewarded trajectory (infra_error,
  agent_error) never enters a batch; neither does one more than `max_staleness` versions older than
  the policy (counted from its oldest token).
- async (SAO, sao.md sections 2 and 5): a batch is the first B usable trajectories, taken the moment
  B are there; workers never wait, weights change under running episodes (every token records its
  version). sync (the baseline, section 6): `B / G` tasks x G rollouts per round; the trainer waits
  for the whole round (a barrier), the feed hands out nothing until the new weights are published.
- Resume: `sao train` on a run directory with a checkpoint continues from it. The checkpoint holds
  the ids consumed so far; trajectories consumed after it are consumed again (the weights roll back
  with them), and nothing in the store is ever deleted.
- No hangs: every wait has a timeout (`trainer.*_timeout_s`) and a message saying what it waited for;
  a rollout worker that dies is reported and replaced (`LoopError` after too many deaths); a dead
  engine, or episodes that all end in infra errors, end the run with a `LoopError` saying so.
- One `sao train` per run directory at a time (a lock file; the OS releases it when the process dies).
"""
from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import torch

from core.errors import UserError
from core.runlock import lock_file


class LoopError(RuntimeError):
    """The loop cannot go on (a timeout, a dead engine, workers dying); the message says why."""


# --- the trace store as a queue ---------------------------------------------------------------------


@dataclass
class Entry:
    """A finished trajectory in the store, not consumed yet (the heavy columns stay on disk)."""

    traj_id: str
    shard: Path
    status: str
    reward: float | None
    min_version: int | None  # the policy version of its oldest token (None: no action token)
    round: str | None  # sync mode: the round it belongs to
    last_attempt: bool  # False: an infra error that was retried
    error: str | None = None  # an infra error's reason


class TraceQueue:
    """Trajectories in the trace store that are not consumed yet, in stream (shard-name) order.

    `consumed` is the position in the stream: the traj ids consumed so far, in order (a checkpoint
    saves it). Every shard is read once, when it first appears; a shard is complete when it appears
    (the store renames it into place).
    """

    def __init__(self, store, consumed: list[str]):
        self.store = store
        self.consumed: list[str] = list(consumed)
        self._consumed = set(consumed)
        self._seen: set[str] = set()
        self.pending: dict[str, Entry] = {}

    def poll(self) -> int:
        """Read the shards that appeared since the last poll; return how many trajectories are new."""
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        new = 0
        for shard in self.store.shards():
            if shard.name in self._seen:
                continue
            table = pq.read_table(shard, columns=["traj_id", "status", "reward", "policy_version", "metadata"])
            rows = table.select(["traj_id", "status", "reward", "metadata"]).to_pylist()
            for i, row in enumerate(rows):
                tid = row["traj_id"]
                if tid in self._consumed or tid in self.pending:
                    continue
                meta = json.loads(row["metadata"] or "{}")
                low = pc.min(table.column("policy_version")[i].values).as_py()
                self.pending[tid] = Entry(tid, shard, row["status"], row["reward"], low, meta.get("round"),
                                          meta.get("last_attempt", True), meta.get("infra_error"))
                new += 1
            self._seen.add(shard.name)
        return new

    def consume(self, entries: list[Entry]) -> None:
        for e in entries:
            del self.pending[e.traj_id]
            self.consumed.append(e.traj_id)
            self._consumed.add(e.traj_id)

    def load(self, entries: list[Entry]):
        """The full trajectories of `entries`, in that order."""
        from harness.store import read_shard

        by_shard: dict[Path, dict] = {}
        for e in entries:
            if e.shard not in by_shard:
                by_shard[e.shard] = {t.traj_id: t for t in read_shard(e.shard)}
        return [by_shard[e.shard][e.traj_id] for e in entries]


@dataclass
class Counters:
    """Cumulative counts of the run (saved in checkpoints)."""

    trained: int = 0
    excluded_unrewarded: int = 0  # infra_error, agent_error: never trained, never a 0
    infra_errors: int = 0
    dropped_stale: int = 0
    worker_deaths: int = 0
    step_counts: dict = field(default_factory=dict)  # this step's excluded / infra / stale (not saved)
    infra_streak: int = 0  # infra errors since the last usable trajectory (not saved)
    last_infra_error: str | None = None

    def count(self, key: str, n: int = 1) -> None:
        setattr(self, key, getattr(self, key) + n)
        self.step_counts[key] = self.step_counts.get(key, 0) + n

    def saved(self) -> dict:
        return {k: getattr(self, k) for k in ("trained", "excluded_unrewarded", "infra_errors", "dropped_stale",
                                                "worker_deaths")}


def _drop(queue: TraceQueue, counters: Counters, entries: list[Entry], why: str) -> None:
    queue.consume(entries)
    for e in entries:
        if why == "stale":
            counters.count("dropped_stale")
        else:
            counters.count("excluded_unrewarded")
            if e.status == "infra_error":
                counters.count("infra_errors")
                counters.infra_streak += 1
                counters.last_infra_error = e.error


def take_async(queue: TraceQueue, counters: Counters, batch_size: int, version: int,
               max_staleness: int) -> list[Entry] | None:
    """The first `batch_size` usable trajectories (consumed), or None; drops the unusable ones on the way."""
    usable = []
    for e in list(queue.pending.values()):
        if e.reward is None:
            _drop(queue, counters, [e], "unrewarded")
        elif e.min_version is not None and version - e.min_version > max_staleness:
            _drop(queue, counters, [e], "stale")
        else:
            usable.append(e)
    if usable:
        counters.infra_streak = 0
    if len(usable) < batch_size:
        return None
    batch = usable[:batch_size]
    queue.consume(batch)
    return batch


def take_round(queue: TraceQueue, counters: Counters, round_id: str, round_size: int) -> list[Entry] | None:
    """Sync mode: once every assignment of `round_id` has finished, its rewarded trajectories (consumed)."""
    mine = [e for e in queue.pending.values() if e.round == round_id]
    retried = [e for e in mine if not e.last_attempt]
    if retried:
        _drop(queue, counters, retried, "unrewarded")
    final = [e for e in mine if e.last_attempt]
    if len(final) < round_size:
        return None
    _drop(queue, counters, [e for e in final if e.reward is None], "unrewarded")
    batch = [e for e in final if e.reward is not None]
    if batch:
        counters.infra_streak = 0
    queue.consume(batch)
    return batch


# --- Ray ------------------------------------------------------------------------------------------


def start_ray(cfg, log=print) -> bool:
    """Connect to `trainer.ray_address`, or start a local Ray on 127.0.0.1 only; True if we started it.

    A process that already called `ray.init` (tests, notebooks) keeps its session. Ray replaces a
    loopback node address by the host's outward one unless it is told this is not a cluster, so the
    local start sets that switch: then every Ray server binds 127.0.0.1 only.
    """
    import ray

    if ray.is_initialized():
        return False
    if cfg.trainer.ray_address:
        log(f"ray: connecting to {cfg.trainer.ray_address}")
        ray.init(address=cfg.trainer.ray_address, log_to_driver=True)
        return True
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # read by Ray's processes at import
    import ray._private.ray_constants as ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False  # this process imported Ray already
    t0 = time.monotonic()
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=True,
             _temp_dir=f"/tmp/sao-ray-{os.getuid()}")
    gcs = ray.get_runtime_context().gcs_address
    if not gcs.startswith("127.0.0.1:"):
        ray.shutdown()
        raise LoopError(f"the local Ray came up on {gcs}, not on 127.0.0.1; set trainer.ray_address to a cluster")
    log(f"ray: local session on {gcs} ({time.monotonic() - t0:.1f}s)")
    return True


def _get(ref, timeout: float, what: str):
    """`ray.get` with a timeout and a message saying what was waited for."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    try:
        return ray.get(ref, timeout=timeout)
    except GetTimeoutError:
        raise LoopError(f"{what}: no answer within {timeout:g}s") from None
    except RayActorError as e:
        raise LoopError(f"{what}: the actor died: {e}") from None


def _frac_idle(busy_s: float, span_s: float) -> float:
    return min(1.0, max(0.0, 1.0 - busy_s / max(span_s, 1e-9)))


# --- models ---------------------------------------------------------------------------------------


def build_trainer(cfg, model_path: str, ckpt: Path | None):
    """(policy, critic, SAOTrainer, tokenizer), fresh from `model_path` or restored from `ckpt`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.checkpoint import read_state, restore_optimizers
    from trainer.models import Critic, load_critic
    from trainer.sao import SAOTrainer

    tc = cfg.trainer
    src = str(ckpt / "policy") if ckpt else model_path
    policy = AutoModelForCausalLM.from_pretrained(src, dtype=getattr(torch, cfg.model.dtype))
    tokenizer = AutoTokenizer.from_pretrained(src)
    critic = None
    if tc.advantage == "gae":
        if ckpt:
            critic = load_critic(ckpt / "critic")
        elif tc.value_pretrain_checkpoint:
            critic = load_critic(tc.value_pretrain_checkpoint)
        else:
            critic = Critic.from_policy(policy)
    if tc.gradient_checkpointing:
        policy.gradient_checkpointing_enable()
        if critic is not None:
            critic.backbone.gradient_checkpointing_enable()
    trainer = SAOTrainer(policy, critic, tc)
    if ckpt:
        state = read_state(ckpt)
        restore_optimizers(ckpt, trainer)
        trainer.policy_version = state["policy_version"]
        trainer.updates = state["updates"]
        trainer.critic_optimizer_steps = state["critic_optimizer_steps"]
        trainer.policy_optimizer_steps = state["policy_optimizer_steps"]
    return policy, critic, trainer, tokenizer


def _check(cfg) -> None:
    tc = cfg.trainer
    if tc.mode == "sync" and tc.batch_size % tc.group_size:
        raise UserError(f"trainer.mode=sync: trainer.batch_size ({tc.batch_size}) must be a multiple of "
                        f"trainer.group_size ({tc.group_size}): a batch holds whole groups")
    if tc.mode == "async" and tc.advantage == "grpo":
        raise UserError("trainer.advantage=grpo needs groups of rollouts per task: use trainer.mode=sync "
                        "(async SAO runs single rollouts; use advantage=gae or running_mean)")


def _resolved(cfg):
    """A copy of cfg with absolute paths (actors run in other working directories) and the model resolved."""
    from harness.tiny_model import resolve_model_path

    cfg = cfg.model_copy(deep=True)
    cfg.run.root = cfg.run.root.resolve()
    cfg.model.cache_dir = cfg.model.cache_dir.resolve()
    path = resolve_model_path(cfg.model)
    cfg.model.path = str(Path(path).resolve()) if Path(path).exists() else path
    return cfg


# --- the loop -------------------------------------------------------------------------------------


def train(cfg, *, update_fn=None, log=print) -> dict:
    """Run `sao train` for `cfg` (see the module doc); return a summary of the run.

    `update_fn(trainer, trajectories) -> metrics` replaces `SAOTrainer.update` (the benchmark's
    fixed-duration update); it must advance `trainer.policy_version` when it changes the policy.
    """
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    _check(cfg)
    cfg = _resolved(cfg)
    run_dir = cfg.run.dir
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = lock_file(run_dir / ".train.lock", f"{run_dir} is in use by another `sao train`")
    try:
        return _train(cfg, update_fn, log)
    finally:
        lock.close()


def _train(cfg, update_fn, log) -> dict:
    import ray

    from harness.store import TraceStore
    from tasks.loaders import tasks_from_config
    from trainer.actors import EngineActor, RolloutWorker, TaskFeed
    from trainer.checkpoint import clean_partial, latest_checkpoint, read_state, restore_rng, save_checkpoint
    from trainer.metrics import MetricsLogger, progress_line

    tc = cfg.trainer
    run_dir = cfg.run.dir
    store = TraceStore(run_dir)
    store.clean_partial()
    clean_partial(run_dir)

    # 1. the trainer: fresh, or resumed from the latest checkpoint
    ckpt = latest_checkpoint(run_dir)
    state = read_state(ckpt) if ckpt else {}
    step = state.get("step", 0)
    if step >= tc.max_steps:
        log(f"sao train: {run_dir} is at step {step} of trainer.max_steps={tc.max_steps}: nothing to do "
            f"(raise trainer.max_steps to continue)")
        return {"steps": step, "checkpoint": str(ckpt), "resumed": True, "nothing_to_do": True}
    torch.manual_seed(cfg.run.seed)
    policy, critic, trainer, tokenizer = build_trainer(cfg, cfg.model.path, ckpt)
    if ckpt:
        restore_rng(ckpt)
        log(f"sao train: resuming {run_dir} from {ckpt.name} (step {step}, policy version {trainer.policy_version}, "
            f"{len(state['consumed'])} trajectories consumed)")
    else:
        log(f"sao train: new run in {run_dir} ({tc.mode}, env={tc.env}, batch {tc.batch_size}, {tc.max_steps} steps)")
    counters = Counters(**state.get("counters", {}))
    queue = TraceQueue(store, state.get("consumed", []))
    update_fn = update_fn or (lambda t, trajs: t.update(trajs))

    # 2. tasks (and, for swe, their images)
    tasks, errors = tasks_from_config(cfg)
    for e in errors:
        log(f"skipping a task that does not validate: {e}")
    if tc.env == "swe":
        tasks = [t for t in tasks if t.image]
    if not tasks:
        raise UserError(f"no runnable tasks from tasks.source={cfg.tasks.source!r}")
    if tc.env == "swe":
        from harness.rollout import prepare_images

        prepare_images(cfg, tasks, log=log)

    session = uuid.uuid4().hex[:8]
    run_id = f"{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}-{session}"
    summary: dict = {"run_dir": str(run_dir), "resumed": ckpt is not None, "start_step": step, "session": session,
                     "update_intervals": [], "steps": step}
    engine = feed = scope = metrics_log = None
    workers: dict[str, object] = {}  # worker id -> actor
    runs: dict[str, object] = {}  # worker id -> the ref of its run()
    started_ray = start_ray(cfg, log)
    try:
        if tc.env == "swe":
            from envs.gc import run_scope

            scope = run_scope(run_id)  # the run's sandboxes go away however this ends
            scope.__enter__()
        metrics_log = MetricsLogger(run_dir)
        # 3. the actors
        timeout = tc.actor_timeout_s
        engine_cfg = cfg
        if ckpt:  # the engine serves the checkpoint's weights
            engine_cfg = cfg.model_copy(deep=True)
            engine_cfg.model.path = str(ckpt / "policy")
        engine_opts = {"max_concurrency": cfg.rollout.workers + 8, "name": f"sao-engine-{session}"}
        if cfg.engine.kind == "vllm":
            engine_opts["num_gpus"] = cfg.engine.tensor_parallel_size
        engine = EngineActor.options(**engine_opts).remote(engine_cfg, trainer.policy_version)
        feed = TaskFeed.remote(tasks, cfg.run.seed, tc.mode, tc.group_size, tc.batch_size // tc.group_size,
                               session, state.get("feed_position", 0))
        base_url = _get(engine.base_url.remote(), timeout, "starting the engine actor")
        simulated_engine = tc.env == "simulated" and tc.sim_engine_s is not None
        log(f"engine: {'sleep (simulated)' if simulated_engine else cfg.engine.kind} at {base_url}, "
            f"policy version {trainer.policy_version}")
        round_id = f"{session}:{step}"
        if tc.mode == "sync":
            _get(feed.open_round.remote(round_id), timeout, "opening the first round")

        # rollout workers run on the engine's node: they reach its proxy on 127.0.0.1
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        on_engine_node = NodeAffinitySchedulingStrategy(_get(engine.node_id.remote(), timeout, "engine node"), soft=False)

        def start_worker(wid: str) -> None:
            w = RolloutWorker.options(name=f"sao-worker-{session}-{wid}", scheduling_strategy=on_engine_node).remote(
                wid, cfg, engine, feed, run_id)
            workers[wid], runs[wid] = w, w.run.remote()

        engine_alive = engine.serve.remote()  # fails the moment the engine actor dies
        for i in range(cfg.rollout.workers):
            start_worker(f"w{i}")
        log(f"rollout: {cfg.rollout.workers} worker(s) over {len(tasks)} task(s), traces -> {store.dir}")

        def check_workers() -> None:
            """A dead engine ends the run. A worker whose run() returned or raised died: report it, give its
            task back, replace it. A run whose episodes all fail (infra errors only) ends too."""
            if ray.wait([engine_alive], timeout=0)[0]:
                _get(engine_alive, timeout, "the engine actor")  # raises LoopError naming the cause
            if counters.infra_streak >= max(20, 3 * tc.batch_size):
                raise LoopError(f"{counters.infra_streak} infra errors in a row and no usable trajectory; the last: "
                                f"{counters.last_infra_error}")
            ready, _ = ray.wait(list(runs.values()), num_returns=len(runs), timeout=0)
            for wid in [w for w, r in runs.items() if r in ready]:
                try:
                    why = f"run() returned {ray.get(runs[wid])}"
                except Exception as e:  # RayActorError (process died) or the exception run() raised
                    why = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
                counters.count("worker_deaths")
                log(f"rollout worker {wid} died ({why}); replacing it")
                if counters.worker_deaths > 3 * cfg.rollout.workers:
                    raise LoopError(f"{counters.worker_deaths} rollout worker deaths; the last: {wid}: {why}")
                _get(feed.release.remote(wid), timeout, "giving a dead worker's task back")
                ray.kill(workers.pop(wid))
                del runs[wid]
                start_worker(f"{wid}.r{counters.worker_deaths}")

        def worker_report() -> str:
            try:
                st = ray.get([w.status.remote() for w in workers.values()], timeout=10)
                return "; ".join(f"{s['worker']}: {s['episodes']} episodes, running {s['current']}" for s in st)
            except Exception as e:
                return f"(worker status unavailable: {type(e).__name__})"

        def next_batch() -> list[Entry]:
            """Block until a batch is ready; a timeout when no trajectory arrives for batch_timeout_s."""
            last_new = time.monotonic()
            while True:
                check_workers()
                if queue.poll():
                    last_new = time.monotonic()
                if tc.mode == "async":
                    batch = take_async(queue, counters, tc.batch_size, trainer.policy_version, tc.max_staleness)
                else:
                    batch = take_round(queue, counters, round_id, tc.batch_size)
                if batch is not None:
                    return batch
                if time.monotonic() - last_new > tc.batch_timeout_s:
                    raise LoopError(f"waiting for a batch of {tc.batch_size}: no new trajectory in "
                                    f"{tc.batch_timeout_s:g}s (trainer.batch_timeout_s); {len(queue.pending)} pending; "
                                    f"workers: {worker_report()}")
                time.sleep(tc.poll_interval_s)

        # 4. the loop
        t_loop = time.monotonic()
        eng0 = _get(engine.stats.remote(), timeout, "engine stats")
        eng_prev, t_prev = eng0, t_loop
        wait_total = 0.0
        trained_here = 0
        while step < tc.max_steps:
            counters.step_counts = {}
            t0 = time.monotonic()
            entries = next_batch()
            t1, wall_t1 = time.monotonic(), time.time()
            trajectories = queue.load(entries)
            version_before = trainer.policy_version
            metrics = update_fn(trainer, trajectories)
            t2 = time.monotonic()
            if trainer.policy_version != version_before:  # publish: episodes keep running meanwhile
                ref = ray.put({k: v.detach() for k, v in policy.state_dict().items()})
                _get(engine.update_weights.remote(trainer.policy_version, ref, tc.publish_timeout_s),
                     tc.publish_timeout_s + 30, f"publishing weights version {trainer.policy_version} to the engine")
                del ref
            t3 = time.monotonic()
            step += 1
            summary["update_intervals"].append((wall_t1, time.time()))  # from batch taken to weights published
            if tc.mode == "sync":  # the barrier opens: the next round runs on the new weights
                round_id = f"{session}:{step}"
                if step < tc.max_steps:
                    _get(feed.open_round.remote(round_id), timeout, "opening the next round")
            counters.trained += len(trajectories)
            trained_here += len(trajectories)

            # metrics: the update's (sao.md section 7) and the loop's
            eng = _get(engine.stats.remote(), timeout, "engine stats")
            now = time.monotonic()
            wait_total += t1 - t0
            consumed_step = len(entries) + sum(counters.step_counts.values())
            lags = [version_before - e.min_version for e in entries if e.min_version is not None]
            metrics.update(
                queue_depth=float(sum(e.reward is not None for e in queue.pending.values())),
                dropped_stale=float(counters.step_counts.get("dropped_stale", 0)),
                excluded_unrewarded=float(counters.step_counts.get("excluded_unrewarded", 0)),
                infra_errors=float(counters.step_counts.get("infra_errors", 0)),
                infra_failure_rate=counters.step_counts.get("infra_errors", 0) / max(consumed_step, 1),
                dropped_stale_total=float(counters.dropped_stale), infra_errors_total=float(counters.infra_errors),
                trained_total=float(counters.trained), worker_deaths_total=float(counters.worker_deaths),
                policy_optimizer_steps=float(trainer.policy_optimizer_steps),
                critic_optimizer_steps=float(trainer.critic_optimizer_steps),
                staleness_mean=sum(lags) / len(lags) if lags else 0.0, staleness_max=float(max(lags, default=0)),
                engine_version=float(eng["version"]),
                engine_idle_frac=_frac_idle(eng["busy_s"] - eng_prev["busy_s"], eng["up_s"] - eng_prev["up_s"]),
                trainer_idle_frac=(t1 - t0) / max(now - t_prev, 1e-9),
                time_wait_s=t1 - t0, time_update_s=t2 - t1, time_publish_s=t3 - t2,
                trajectories_per_hour=trained_here / max(now - t_loop, 1e-9) * 3600,
            )
            t4 = time.monotonic()
            if step % tc.save_every == 0 or step == tc.max_steps:
                feed_state = _get(feed.state.remote(), timeout, "task feed state")
                path = save_checkpoint(run_dir, step, policy=policy, critic=critic, trainer=trainer,
                                       tokenizer=tokenizer, keep=tc.keep_checkpoints, state={
                                           "policy_version": trainer.policy_version, "updates": trainer.updates,
                                           "critic_optimizer_steps": trainer.critic_optimizer_steps,
                                           "policy_optimizer_steps": trainer.policy_optimizer_steps,
                                           "consumed": queue.consumed, "counters": counters.saved(),
                                           "feed_position": feed_state["position"], "mode": tc.mode,
                                           "session": session, "time": time.time()})
                metrics["time_checkpoint_s"] = time.monotonic() - t4
                summary["checkpoint"] = str(path)
            metrics_log.log(step, metrics)
            log(progress_line(step, trainer.policy_version, int(metrics["queue_depth"]), metrics,
                              metrics["trajectories_per_hour"])
                + f" | engine idle {metrics['engine_idle_frac']:.0%} | trainer idle {metrics['trainer_idle_frac']:.0%}"
                + f" | stale {counters.dropped_stale} | infra {counters.infra_errors}"
                + (f" | saved {Path(summary['checkpoint']).name}" if "time_checkpoint_s" in metrics else ""))
            eng_prev, t_prev = eng, now
            summary["steps"] = step

        check_workers()  # a death during the last step is reported too
        wall = time.monotonic() - t_loop
        eng_busy = eng_prev["busy_s"] - eng0["busy_s"]
        eng_up = eng_prev["up_s"] - eng0["up_s"]
        summary.update(
            wall_s=wall, trained=trained_here, trained_per_min=trained_here / max(wall, 1e-9) * 60,
            engine_idle_frac=_frac_idle(eng_busy, eng_up), trainer_idle_frac=wait_total / max(wall, 1e-9),
            policy_version=trainer.policy_version, counters=counters.saved(), consumed=list(queue.consumed),
            pending=list(queue.pending))
        log(f"sao train: done, step {step}, policy version {trainer.policy_version}: {trained_here} trajectories "
            f"trained in {wall:.0f}s ({summary['trained_per_min']:.1f}/min), engine idle "
            f"{summary['engine_idle_frac']:.0%}, trainer idle {summary['trainer_idle_frac']:.0%}, "
            f"{counters.infra_errors} infra errors and {counters.dropped_stale} stale excluded; "
            f"checkpoint {summary.get('checkpoint', '-')}")
        return summary
    finally:
        if metrics_log is not None:
            metrics_log.close()
        # episodes in flight are abandoned (never finished, so never in the store): kill the workers
        # first and let them be gone before the engine goes (or they would store engine failures)
        for w in workers.values():
            ray.kill(w)
        if runs:
            ray.wait(list(runs.values()), num_returns=len(runs), timeout=30)
        for actor in (feed, engine):
            if actor is not None:
                ray.kill(actor)
        if scope is not None:
            scope.__exit__(None, None, None)
        if started_ray:
            ray.shutdown()
