"""`sao train`: the asynchronous SAO loop, and the synchronous group baseline in the same code.

    this process: the trainer                            Ray actors (trainer.actors)
    --------------------------                           ---------------------------
    policy, critic, optimizers (fresh or resumed)        EngineActor x engine.replicas (EngineReplicas):
    start the actors ------------------------------->      engine + proxy on proxy.host (127.0.0.1)
    until max_steps:                                     TaskFeed      the task cycle (sync: rounds), and
      batch   <- B finished trajectories, from the                     each episode's replica (least loaded)
                 trace store (the queue, trainer.queue)  RolloutWorker x rollout.workers (WorkerPool):
      update  =  SAOTrainer.update(batch): K critic steps    task -> episode -> trace store, at once
                 + one policy step
      publish =  version + 1 to every replica (runtime.weight_sync: object store or a collective)
      metrics, progress line; checkpoint every save_every steps

- The queue is the trace store (`trainer.queue`): consumed = trained, or excluded and counted (an
  unrewarded trajectory; one more than `max_staleness` versions older than the policy; one with
  history breaks, which the update skips: `rollout/break_frac`, trainer.sao). Consumed is final: a
  resumed run never reads it again.
- async (SAO, docs/algorithm.md sections 2, 5): a batch is the first B usable trajectories, taken the moment
  B are there; workers never wait, weights change under running episodes (every token records its
  version). sync (the baseline, section 6): `B / G` tasks x G rollouts per round; the trainer waits
  for the whole round (a barrier), the feed hands out nothing until the new weights are published.
- Resume: `sao train` on a run directory with a checkpoint continues from it. The checkpoint holds
  the ids consumed so far; trajectories consumed after it are consumed again (the weights roll back
  with them), and nothing in the store is ever deleted.
- No hangs: every wait has a timeout (`runtime.*_timeout_s`) and a message saying what it waited for;
  a rollout worker or an engine replica that dies is reported and replaced (`LoopError` after too
  many deaths); a publish that does not reach every replica, episodes that all end in infra
  errors, or a share of them over `rollout.max_infra_frac` (`rollout/infra_frac`, by kind:
  `rollout/infra/<kind>`), end the run with a `LoopError` saying so.
- Replicas and staleness: a step ends when every replica serves the new version, so the replicas
  are never more than one version apart and the staleness bound holds across them.
- `runtime.world_size > 1`: the update, publish and checkpoint run on that many FSDP2 rank actors
  (trainer.ranks, trainer.distributed) instead of in this process; rank 0 answers.
- Config: `train(cfg)` is the CLI's entry and takes the whole run config; below it a function takes
  the sections it reads (`trainer`, `runtime`, `sampling`, ...). The whole config goes on only to the
  Ray actors that run harness code: the engine replicas (engine + proxy) and the rollout workers
  (the episode functions of harness.runner read it).
- One `sao train` per run directory at a time (a lock file; the OS releases it when the process dies).
"""
from __future__ import annotations

import functools
import secrets
import time
import uuid
from pathlib import Path

import ray
import torch

from sao_harness.core.errors import UserError
from sao_harness.core.runlock import lock_file
from sao_harness.envs.gc import run_scope
from sao_harness.harness.config import SamplingConfig
from sao_harness.harness.infra import kinds_line
from sao_harness.harness.proxy import check_loopback
from sao_harness.harness.rollout import prepare_images
from sao_harness.harness.runner import episode_function
from sao_harness.harness.store import TraceStore
from sao_harness.harness.tiny_model import resolve_model_path
from sao_harness.harness.trace import INFRA_ERRORS
from sao_harness.tasks.loaders import tasks_from_config
from sao_harness.trainer.actors import TaskFeed
from sao_harness.trainer.checkpoint import (
    clean_partial,
    is_sharded,
    latest_checkpoint,
    read_state,
    restore_optimizers,
    restore_rng,
    save_checkpoint,
)
from sao_harness.trainer.config import RuntimeConfig, TrainerConfig
from sao_harness.trainer.critic_init import initial_critic
from sao_harness.trainer.metrics import MetricsLogger, progress_line
from sao_harness.trainer.models import Critic, load_critic
from sao_harness.trainer.queue import Counters, Entry, TraceQueue, infra_frac
from sao_harness.trainer.ranks import Ranks, publish_weights
from sao_harness.trainer.ray_utils import get, start_ray
from sao_harness.trainer.sao import SAOTrainer
from sao_harness.trainer.sharded import checkpoint_layers
from sao_harness.trainer.weight_sync import make_weight_sync
from sao_harness.trainer.workers import EngineReplicas, WorkerPool

# --- setup ------------------------------------------------------------------------------------------


def build_trainer(tc: TrainerConfig, sampling: SamplingConfig, device: str, model_path: str, dtype: str,
                  ckpt: Path | None):
    """(policy, critic, SAOTrainer, tokenizer) of one process on `device`, in model `dtype`, fresh from
    `model_path` (the critic: critic_init.initial_critic) or restored from `ckpt` (either checkpoint
    format: a sharded one's fp32 masters come from its dcp/, see checkpoint.restore_optimizers)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: heavy

    src = str(ckpt / "policy") if ckpt else model_path
    policy = AutoModelForCausalLM.from_pretrained(src, dtype=getattr(torch, dtype))
    tokenizer = AutoTokenizer.from_pretrained(src)
    critic = None
    if tc.advantage == "gae":
        if ckpt and not is_sharded(ckpt):
            critic = load_critic(ckpt / "critic")
        elif ckpt:  # the architecture; the weights come from dcp/
            critic = Critic.from_policy(policy)
        else:
            critic = initial_critic(tc, policy)
    if not tc.gradient_checkpointing and tc.checkpoint_above_tokens is not None:  # (always on: SAOTrainer)
        for model in (policy, critic.backbone if critic is not None else None):
            if model is not None:
                checkpoint_layers(model, tc.checkpoint_above_tokens)
    trainer = SAOTrainer(policy, critic, tc, sampling=sampling, device=device)
    if ckpt:
        state = read_state(ckpt)
        restore_optimizers(ckpt, trainer)
        trainer.policy_version = state["policy_version"]
        trainer.updates = state["updates"]
        trainer.critic_optimizer_steps = state["critic_optimizer_steps"]
        trainer.policy_optimizer_steps = state["policy_optimizer_steps"]
    return policy, critic, trainer, tokenizer


def _check(tc: TrainerConfig, rt: RuntimeConfig) -> None:
    episode_function(tc.env)  # a UserError for an env nothing registered
    if tc.mode == "sync" and tc.batch_size % tc.group_size:
        raise UserError(f"trainer.mode=sync: trainer.batch_size ({tc.batch_size}) must be a multiple of "
                        f"trainer.group_size ({tc.group_size}): a batch holds whole groups")
    if tc.mode == "async" and tc.advantage == "grpo":
        raise UserError("trainer.advantage=grpo needs groups of rollouts per task: use trainer.mode=sync "
                        "(async SAO runs single rollouts; use advantage=gae or running_mean)")
    if rt.world_size > 1 and tc.minibatches > 1:
        raise UserError(f"runtime.world_size={rt.world_size} needs trainer.minibatches=1 (a minibatch would be "
                        "a slice of each rank's part, not of the global batch)")


def _resolved(cfg):
    """A copy of cfg with absolute paths (actors run in other working directories), the model resolved and
    the proxy token in force written in (workers on other nodes lack $SAO_PROXY_TOKEN); a routable
    `proxy.host` without a token gets a fresh one for this run (never written anywhere)."""
    cfg = cfg.model_copy(deep=True)
    cfg.run.root = cfg.run.root.resolve()
    cfg.model.cache_dir = cfg.model.cache_dir.resolve()
    path = resolve_model_path(cfg.model)
    cfg.model.path = str(Path(path).resolve()) if Path(path).exists() else path
    cfg.proxy.token = cfg.proxy.resolved_token()
    try:
        check_loopback(cfg.proxy.host, cfg.proxy.token)
    except UserError:
        cfg.proxy.token = secrets.token_urlsafe(32)
    return cfg


def _runnable_tasks(cfg, log) -> list:
    """The tasks of `tasks.source` that validate (for swe: with an image, built or present)."""
    tasks, errors = tasks_from_config(cfg)
    for e in errors:
        log(f"skipping a task that does not validate: {e}")
    if cfg.trainer.env == "swe":
        tasks = [t for t in tasks if t.image]
    if not tasks:
        raise UserError(f"no runnable tasks from tasks.source={cfg.tasks.source!r}")
    if cfg.trainer.env == "swe":
        prepare_images(cfg, tasks, log=log)
    return tasks


def _start_actors(cfg, ckpt: Path | None, trainer, policy, tasks: list, session: str, feed_position: int,
                  counters: Counters, log):
    """The task feed and the engine replicas (serving the checkpoint's weights when resuming)."""
    tc, rt = cfg.trainer, cfg.runtime
    engine_cfg = cfg
    if ckpt:
        engine_cfg = cfg.model_copy(deep=True)
        engine_cfg.model.path = str(ckpt / "policy")
    feed = TaskFeed.remote(tasks, cfg.run.seed, tc.mode, tc.group_size, tc.batch_size // tc.group_size, session,
                           feed_position)
    weights = lambda: (trainer.policy_version, publish_weights(trainer, policy, cfg.model.dtype))
    engines = EngineReplicas(engine_cfg, feed, make_weight_sync(rt, cfg.engine.kind, log), session=session,
                             counters=counters, log=log, weights=weights)
    engines.start(trainer.policy_version)
    simulated_engine = tc.env == "simulated" and cfg.testbed.simulated.engine_s is not None
    urls = ", ".join(f"{name} {info['url']}" for name, info in engines.infos.items())
    log(f"engine: {'sleep (simulated)' if simulated_engine else cfg.engine.kind} x {len(engines.infos)} "
        f"({urls}), policy version {trainer.policy_version}, weight sync {engines.sync.name}")
    return engines, feed


def _frac_idle(busy_s: float, span_s: float) -> float:
    return min(1.0, max(0.0, 1.0 - busy_s / max(span_s, 1e-9)))


def _loop_metrics(entries: list[Entry], queue: TraceQueue, counters: Counters, trainer, version_before: int,
                  eng: dict, eng_prev: dict) -> dict[str, float]:
    """The loop's metrics of one step (the update returns its own, docs/algorithm.md section 7)."""
    step_counts = counters.step_counts
    consumed_step = len(entries) + step_counts.get("dropped_stale", 0) + step_counts.get("excluded_unrewarded", 0)
    lags = [version_before - e.min_version for e in entries if e.min_version is not None]
    return {
        "rollout/queue_depth": float(sum(e.reward is not None for e in queue.pending.values())),
        "rollout/dropped_stale": float(step_counts.get("dropped_stale", 0)),
        "rollout/excluded_unrewarded": float(step_counts.get("excluded_unrewarded", 0)),
        "rollout/infra_errors": float(step_counts.get(INFRA_ERRORS, 0)),
        "rollout/infra_failure_rate": step_counts.get(INFRA_ERRORS, 0) / max(consumed_step, 1),
        "rollout/dropped_stale_total": float(counters.dropped_stale),
        "rollout/infra_errors_total": float(counters.infra_errors),
        "rollout/infra_frac": infra_frac(queue, counters),
        **{f"rollout/infra/{kind}": float(n) for kind, n in counters.infra_kinds.items()},
        "rollout/trained_total": float(counters.trained), "rollout/worker_deaths_total": float(counters.worker_deaths),
        "policy/optimizer_steps": float(trainer.policy_optimizer_steps),
        "critic/optimizer_steps": float(trainer.critic_optimizer_steps),
        "rollout/staleness_mean": sum(lags) / len(lags) if lags else 0.0,
        "rollout/staleness_max": float(max(lags, default=0)),
        "rollout/engine_version": float(eng["version"]),
        "perf/engine_idle_frac": _frac_idle(eng["busy_s"] - eng_prev["busy_s"], eng["up_s"] - eng_prev["up_s"]),
    }


# --- the loop -------------------------------------------------------------------------------------


def train(cfg, *, update_fn=None, log=print) -> dict:
    """Run `sao train` for `cfg` (see the module doc); return a summary of the run.

    `update_fn(trainer, trajectories) -> metrics` replaces `SAOTrainer.update` (the benchmark's
    fixed-duration update); it must advance `trainer.policy_version` when it changes the policy.
    """
    from transformers.utils import logging as hf_logging  # lazy: heavy

    hf_logging.disable_progress_bar()
    _check(cfg.trainer, cfg.runtime)
    cfg = _resolved(cfg)
    run_dir = cfg.run.dir
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = lock_file(run_dir / ".train.lock", f"{run_dir} is in use by another `sao train`")
    try:
        return _train(cfg, update_fn or (lambda t, trajs: t.update(trajs)), log)
    finally:
        lock.close()


def _train(cfg, update_fn, log) -> dict:
    tc, rt, run_dir = cfg.trainer, cfg.runtime, cfg.run.dir
    store = TraceStore(run_dir)
    store.clean_partial()
    clean_partial(run_dir)

    # 1. resolve: a fresh trainer, or the latest checkpoint's
    ckpt = latest_checkpoint(run_dir)
    state = read_state(ckpt) if ckpt else {}
    step = state.get("step", 0)
    if step >= tc.max_steps:
        log(f"sao train: {run_dir} is at step {step} of trainer.max_steps={tc.max_steps}: nothing to do "
            f"(raise trainer.max_steps to continue)")
        return {"steps": step, "checkpoint": str(ckpt), "resumed": True, "nothing_to_do": True}
    torch.manual_seed(cfg.run.seed)
    policy = critic = trainer = tokenizer = None  # world_size > 1: the ranks (trainer.ranks) start with Ray
    if rt.world_size == 1:
        policy, critic, trainer, tokenizer = build_trainer(tc, cfg.sampling, rt.device, cfg.model.path,
                                                           cfg.model.dtype, ckpt)
    if ckpt:
        restore_rng(ckpt)
        log(f"sao train: resuming {run_dir} from {ckpt.name} (step {step}, policy version {state['policy_version']}, "
            f"{len(state['consumed'])} trajectories consumed)")
    else:
        log(f"sao train: new run in {run_dir} ({tc.mode}, env={tc.env}, batch {tc.batch_size}, {tc.max_steps} steps)")
    counters = Counters(**state.get("counters", {}))
    queue = TraceQueue(store, state.get("consumed", []))
    tasks = _runnable_tasks(cfg, log)

    # 2. start: Ray, the engine, the task feed, the rollout workers
    session = uuid.uuid4().hex[:8]
    run_id = f"{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}-{session}"
    summary: dict = {"run_dir": str(run_dir), "resumed": ckpt is not None, "start_step": step, "session": session,
                     "update_intervals": [], "steps": step}
    engines = feed = pool = scope = metrics_log = None
    timeout = rt.actor_timeout_s
    started_ray = start_ray(rt.ray_address, log)
    try:
        if trainer is None:
            trainer = Ranks(tc, rt, cfg.sampling, cfg.model.path, cfg.model.dtype, cfg.run.seed, ckpt, log)
            tokenizer = trainer.tokenizer
        save = (trainer.save_checkpoint if isinstance(trainer, Ranks)
                else functools.partial(save_checkpoint, policy=policy, critic=critic, trainer=trainer))
        if tc.env == "swe":
            scope = run_scope(run_id)  # the run's sandboxes go away however this ends
            scope.__enter__()
        metrics_log = MetricsLogger(run_dir)
        engines, feed = _start_actors(cfg, ckpt, trainer, policy, tasks, session, state.get("feed_position", 0),
                                      counters, log)
        round_id = f"{session}:{step}"
        if tc.mode == "sync":
            get(feed.open_round.remote(round_id), timeout, "opening the first round")
        pool = WorkerPool(cfg, engines, feed, session=session, run_id=run_id, counters=counters, log=log)
        pool.start(cfg.rollout.workers)
        log(f"rollout: {cfg.rollout.workers} worker(s) over {len(tasks)} task(s), traces -> {store.dir}")

        # 3. the loop: batch, update, publish, (sync: next round), metrics, checkpoint, log
        t_loop = time.monotonic()
        eng0 = eng_prev = engines.stats()
        t_prev, wait_total, trained_here = t_loop, 0.0, 0
        budget_s = tc.max_minutes * 60 if tc.max_minutes else float("inf")
        while step < tc.max_steps:
            counters.step_counts = {}
            t0 = time.monotonic()
            entries = pool.next_batch(queue, trainer.policy_version, round_id)
            t1, wall_t1 = time.monotonic(), time.time()
            trajectories = queue.load(entries)
            version_before = trainer.policy_version
            metrics = update_fn(trainer, trajectories)
            t2 = time.monotonic()
            if trainer.policy_version != version_before:  # to every replica; episodes keep running
                engines.publish(trainer.policy_version, publish_weights(trainer, policy, cfg.model.dtype))
            t3 = time.monotonic()
            step += 1
            summary["update_intervals"].append((wall_t1, time.time()))  # from batch taken to weights published
            if tc.mode == "sync":  # the barrier opens: the next round runs on the new weights
                round_id = f"{session}:{step}"
                if step < tc.max_steps:
                    get(feed.open_round.remote(round_id), timeout, "opening the next round")
            trained = sum(not t.breaks for t in trajectories)  # one with breaks: consumed, skipped (trainer.sao)
            counters.trained += trained
            trained_here += trained

            eng = engines.stats()
            now = time.monotonic()
            wait_total += t1 - t0
            metrics.update(_loop_metrics(entries, queue, counters, trainer, version_before, eng, eng_prev))
            metrics.update({"perf/trainer_idle_frac": (t1 - t0) / max(now - t_prev, 1e-9),
                            "perf/trajectories_per_hour": trained_here / max(now - t_loop, 1e-9) * 3600,
                            "time/wait_s": t1 - t0, "time/update_s": t2 - t1, "time/publish_s": t3 - t2,
                            "time/step_s": now - t_prev})
            t4 = time.monotonic()
            out_of_time = time.monotonic() - t_loop >= budget_s  # checked once: the step it is true is saved
            if step % tc.save_every == 0 or step == tc.max_steps or out_of_time:
                feed_state = get(feed.state.remote(), timeout, "task feed state")
                path = save(run_dir, step, tokenizer=tokenizer, keep=rt.keep_checkpoints, state={
                                           "policy_version": trainer.policy_version, "updates": trainer.updates,
                                           "critic_optimizer_steps": trainer.critic_optimizer_steps,
                                           "policy_optimizer_steps": trainer.policy_optimizer_steps,
                                           "consumed": queue.consumed, "counters": counters.saved(),
                                           "feed_position": feed_state["position"], "mode": tc.mode,
                                           "session": session, "time": time.time()})
                metrics["time/checkpoint_s"] = time.monotonic() - t4
                summary["checkpoint"] = str(path)
            metrics_log.log(step, metrics)
            log(progress_line(step, metrics)
                + (f" | saved {Path(summary['checkpoint']).name}" if "time/checkpoint_s" in metrics else ""))
            eng_prev, t_prev = eng, now
            summary["steps"] = step
            if out_of_time:
                log(f"sao train: trainer.max_minutes={tc.max_minutes:g} reached at step {step}; stopping")
                break

        pool.check()  # a death during the last step is reported too
        wall = time.monotonic() - t_loop
        summary.update(
            wall_s=wall, trained=trained_here, trained_per_min=trained_here / max(wall, 1e-9) * 60,
            engine_idle_frac=_frac_idle(eng_prev["busy_s"] - eng0["busy_s"], eng_prev["up_s"] - eng0["up_s"]),
            trainer_idle_frac=wait_total / max(wall, 1e-9), policy_version=trainer.policy_version,
            counters=counters.saved(), consumed=list(queue.consumed), pending=list(queue.pending))
        kinds = f" ({kinds_line(counters.infra_kinds)})" if counters.infra_kinds else ""
        log(f"sao train: done, step {step}, policy version {trainer.policy_version}: {trained_here} trajectories "
            f"trained in {wall:.0f}s ({summary['trained_per_min']:.1f}/min), engine idle "
            f"{summary['engine_idle_frac']:.0%}, trainer idle {summary['trainer_idle_frac']:.0%}, "
            f"{counters.infra_errors} infra errors{kinds} and {counters.dropped_stale} stale excluded; "
            f"checkpoint {summary.get('checkpoint', '-')}")
        return summary
    finally:
        if metrics_log is not None:
            metrics_log.close()
        if pool is not None:  # the workers go first: episodes in flight are abandoned, never stored
            pool.stop()
        if feed is not None:
            ray.kill(feed)
        if engines is not None:
            engines.stop()
        if scope is not None:
            scope.__exit__(None, None, None)
        if isinstance(trainer, Ranks):
            trainer.close()
        if started_ray:
            ray.shutdown()
