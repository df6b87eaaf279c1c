"""`sao train`: the asynchronous SAO loop, and the synchronous group baseline in the same code.

    this process: the trainer                            Ray actors (trainer.run.actors)
    --------------------------                           ---------------------------
    policy, critic, optimizers (fresh or resumed)        EngineActor x engine.replicas (EngineReplicas):
    start the actors ------------------------------->      engine + proxy on proxy.host (127.0.0.1)
    until max_steps:                                     TaskFeed      the task cycle (sync: rounds), and
      batch   <- B finished trajectories, from the                     each episode's replica (least loaded)
                 trace store (the queue, trainer.run.queue)  RolloutWorker x rollout.workers (WorkerPool):
      update  =  SAOTrainer.update(batch): K critic steps    task -> episode -> trace store, at once
                 + one policy step
      publish =  version + 1 to every replica (runtime.weight_sync: object store or a collective)
      metrics, progress line; checkpoint every save_every steps

- The queue is the trace store (`trainer.run.queue`): consumed = trained, or excluded and counted (an
  unrewarded trajectory; one more than `max_staleness` versions older than the policy; one with
  history breaks, which the update skips: `rollout/break_frac`, trainer.algo.sao). Consumed is final: a
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
  (trainer.run.ranks, trainer.dist.distributed) instead of in this process; rank 0 answers.
- The run is a `TrainRun`: `start` (lock, resolve, start), `step`, `close` (everything started, in reverse:
  one `ExitStack`). A checkpoint is the states of its parts (`state_dict`: the trainer's counters, the
  queue's consumed ids, the counters, the feed's position; weights and optimizers: trainer.dist.checkpoint).
- The env is a spec (`harness.runner.ENVS`): what it prepares before the first episode (swe: images),
  the scope a run lives in (swe: its sandboxes removed), a stand-in engine (simulated: the sleep engine).
- Config: `train(cfg, tasks)` is the CLI's entry and takes the whole run config and the tasks `sao train`
  loaded and pre-flighted (`harness.runner.load_tasks`); below it a function takes
  the sections it reads (`trainer`, `runtime`, `sampling`, ...). The whole config goes on only to the
  Ray actors that run harness code: the engine replicas (engine + proxy) and the rollout workers
  (the episode functions of harness.runner read it).
- One `sao train` per run directory at a time (a lock file; the OS releases it when the process dies).
"""
from __future__ import annotations

import contextlib
import secrets
import time
import uuid
from pathlib import Path

import ray
import torch

from sao_harness.core.errors import UserError
from sao_harness.core.runlock import lock_file
from sao_harness.harness.config import SamplingConfig
from sao_harness.harness.infra import kinds_line
from sao_harness.harness.proxy import check_loopback
from sao_harness.harness.runner import env_spec, load_tasks
from sao_harness.harness.store import TraceStore
from sao_harness.harness.tiny_model import resolve_model_path
from sao_harness.harness.trace import INFRA_ERRORS
from sao_harness.trainer.algo.sao import SAOTrainer
from sao_harness.trainer.config import RuntimeConfig, TrainerConfig
from sao_harness.trainer.dist.checkpoint import (
    clean_partial,
    is_sharded,
    latest_checkpoint,
    read_state,
    restore_optimizers,
    restore_rng,
    save_checkpoint,
)
from sao_harness.trainer.dist.sharded import checkpoint_layers
from sao_harness.trainer.modeling.critic_init import initial_critic
from sao_harness.trainer.modeling.models import Critic, load_critic
from sao_harness.trainer.report.metrics import MetricsLogger, progress_line
from sao_harness.trainer.run.actors import TaskFeed
from sao_harness.trainer.run.queue import Counters, Entry, TraceQueue, infra_frac
from sao_harness.trainer.run.ranks import Ranks, publish_weights
from sao_harness.trainer.run.ray_utils import get, start_ray
from sao_harness.trainer.run.weight_sync import make_weight_sync
from sao_harness.trainer.run.workers import EngineReplicas, WorkerPool

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
        restore_optimizers(ckpt, trainer)
        trainer.load_state_dict(read_state(ckpt))
    return policy, critic, trainer, tokenizer


def _check(tc: TrainerConfig, rt: RuntimeConfig) -> None:
    env_spec(tc.env)  # a UserError for an env nothing registered
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


# --- the run --------------------------------------------------------------------------------------


def train(cfg, tasks: list | None = None, *, update_fn=None, log=print) -> dict:
    """Run `sao train` for `cfg` on `tasks` (None: `harness.runner.load_tasks(cfg, cfg.trainer.env)`; see the
    module doc); return a summary of the run.

    `update_fn(trainer, trajectories) -> metrics` replaces `SAOTrainer.update` (the benchmark's
    fixed-duration update); it must advance `trainer.policy_version` when it changes the policy.
    """
    from transformers.utils import logging as hf_logging  # lazy: heavy

    hf_logging.disable_progress_bar()
    with TrainRun(cfg, tasks, update_fn=update_fn, log=log) as run:
        while not run.done:
            run.step()
        return run.finish()


class TrainRun:
    """One `sao train`: `start()` resolves the run (fresh, or the latest checkpoint's) and starts its parts,
    `step()` trains one step, `finish()` reports, `close()` stops every part started, the last first (one
    `ExitStack`). A checkpoint is the states of the parts (`state_dict`): trainer, queue, counters, feed."""

    def __init__(self, cfg, tasks: list | None = None, *, update_fn=None, log=print):
        _check(cfg.trainer, cfg.runtime)
        self.env = env_spec(cfg.trainer.env)
        self.cfg, self.tasks, self.log = cfg, tasks, log
        self.update_fn = update_fn or (lambda t, trajs: t.update(trajs))
        self.stack = contextlib.ExitStack()
        self.step_no, self.stopped, self.summary = 0, False, {}
        self.pool = None  # started: the run has steps to take

    def __enter__(self) -> TrainRun:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.stack.close()

    @property
    def done(self) -> bool:
        return self.pool is None or self.stopped or self.step_no >= self.cfg.trainer.max_steps

    # --- start ------------------------------------------------------------------------------------

    def start(self) -> None:
        """Lock the run directory, resolve the trainer; start Ray, the env's scope, engines, feed and workers."""
        self.cfg = cfg = _resolved(self.cfg)
        tc, rt, run_dir, log = cfg.trainer, cfg.runtime, cfg.run.dir, self.log
        run_dir.mkdir(parents=True, exist_ok=True)
        self.stack.callback(lock_file(run_dir / ".train.lock", f"{run_dir} is in use by another `sao train`").close)
        self.store = TraceStore(run_dir)
        self.store.clean_partial()  # a killed run's writers' temporary files
        self.stack.callback(self.store.clean_partial)  # at close, after the workers (stopped mid-write) are gone
        clean_partial(run_dir)
        self.ckpt = ckpt = latest_checkpoint(run_dir)
        state = read_state(ckpt) if ckpt else {}
        self.step_no = state.get("step", 0)
        if self.step_no >= tc.max_steps:
            log(f"sao train: {run_dir} is at step {self.step_no} of trainer.max_steps={tc.max_steps}: nothing to do "
                f"(raise trainer.max_steps to continue)")
            self.summary = {"steps": self.step_no, "checkpoint": str(ckpt), "resumed": True, "nothing_to_do": True}
            return
        self._resolve(state)
        self.session = uuid.uuid4().hex[:8]
        self.summary = {"run_dir": str(run_dir), "resumed": ckpt is not None, "start_step": self.step_no,
                        "session": self.session, "update_intervals": [], "steps": self.step_no}
        if start_ray(rt.ray_address, log):
            self.stack.callback(ray.shutdown)
        if self.trainer is None:
            self.trainer = Ranks(tc, rt, cfg.sampling, cfg.model.path, cfg.model.dtype, cfg.run.seed, ckpt, log)
            self.tokenizer = self.trainer.tokenizer
            self.stack.callback(self.trainer.close)
        run_id = f"{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}-{self.session}"
        self.stack.enter_context(self.env.run_scope(run_id))  # swe: the run's sandboxes go away however this ends
        self.metrics_log = MetricsLogger(run_dir)
        self.stack.callback(self.metrics_log.close)
        self._start_actors(state.get("feed_position", 0), run_id)

    def _resolve(self, state: dict) -> None:
        """The trainer (world_size 1: here; else the ranks start with Ray), the queue, the counters, the tasks."""
        cfg, ckpt, log = self.cfg, self.ckpt, self.log
        tc, rt = cfg.trainer, cfg.runtime
        torch.manual_seed(cfg.run.seed)
        self.policy = self.critic = self.trainer = self.tokenizer = None
        if rt.world_size == 1:
            self.policy, self.critic, self.trainer, self.tokenizer = build_trainer(
                tc, cfg.sampling, rt.device, cfg.model.path, cfg.model.dtype, ckpt)
        if ckpt:
            restore_rng(ckpt)
            log(f"sao train: resuming {cfg.run.dir} from {ckpt.name} (step {self.step_no}, policy version "
                f"{state['policy_version']}, {len(state['consumed'])} trajectories consumed)")
        else:
            log(f"sao train: new run in {cfg.run.dir} ({tc.mode}, env={tc.env}, batch {tc.batch_size}, "
                f"{tc.max_steps} steps)")
        self.counters = Counters(**state.get("counters", {}))
        self.queue = TraceQueue(self.store, state.get("consumed", []))
        tasks = self.tasks if self.tasks is not None else load_tasks(cfg, cfg.trainer.env, log=log)
        self.tasks = self.env.prepared(cfg, tasks, log=log)  # swe: the images, built or present

    def _start_actors(self, feed_position: int, run_id: str) -> None:
        """The task feed, the engine replicas (serving the checkpoint's weights when resuming), the first
        round (sync) and the rollout workers."""
        cfg, log, timeout = self.cfg, self.log, self.cfg.runtime.actor_timeout_s
        tc = cfg.trainer
        self.feed = TaskFeed.remote(self.tasks, cfg.run.seed, tc.mode, tc.group_size, tc.batch_size // tc.group_size,
                                    self.session, feed_position)
        self.stack.callback(ray.kill, self.feed)
        engine_cfg = cfg
        if self.ckpt:
            engine_cfg = cfg.model_copy(deep=True)
            engine_cfg.model.path = str(self.ckpt / "policy")
        self.engines = EngineReplicas(engine_cfg, self.feed, make_weight_sync(cfg.runtime, cfg.engine.kind, log),
                                      session=self.session, counters=self.counters, log=log, weights=self._weights,
                                      tasks=self.tasks)
        self.stack.callback(self.engines.stop)
        self.engines.start(self.trainer.policy_version)
        urls = ", ".join(f"{name} {info['url']}" for name, info in self.engines.infos.items())
        log(f"engine: {self.env.stand_in_name(cfg) or cfg.engine.kind} x {len(self.engines.infos)} ({urls}), "
            f"policy version {self.trainer.policy_version}, weight sync {self.engines.sync.name}")
        self.round_id = f"{self.session}:{self.step_no}"
        if tc.mode == "sync":
            get(self.feed.open_round.remote(self.round_id), timeout, "opening the first round")
        pool = WorkerPool(cfg, self.engines, self.feed, session=self.session, run_id=run_id, counters=self.counters,
                          log=log)
        self.stack.callback(pool.stop)  # the workers go first: episodes in flight are abandoned, never stored
        pool.start(cfg.rollout.workers)
        log(f"rollout: {cfg.rollout.workers} worker(s) over {len(self.tasks)} task(s), traces -> {self.store.dir}")
        self.t_loop = self.t_prev = time.monotonic()
        self.eng0 = self.eng_prev = self.engines.stats()
        self.wait_total, self.trained = 0.0, 0
        self.pool = pool

    def _weights(self) -> tuple[int, dict]:
        """(policy version, the weights to publish): a step's publish, a replacement replica's first weights."""
        return self.trainer.policy_version, publish_weights(self.trainer, self.policy, self.cfg.model.dtype)

    # --- step ---------------------------------------------------------------------------------------

    def step(self) -> dict[str, float]:
        """One step: a batch, the update, the publish, (sync) the next round, metrics, a checkpoint when due."""
        tc, trainer, queue = self.cfg.trainer, self.trainer, self.queue
        self.counters.step_counts = {}
        t0 = time.monotonic()
        entries = self.pool.next_batch(queue, trainer.policy_version, self.round_id)
        t1, wall_t1 = time.monotonic(), time.time()
        trajectories = queue.load(entries)
        version_before = trainer.policy_version
        metrics = self.update_fn(trainer, trajectories)
        t2 = time.monotonic()
        if trainer.policy_version != version_before:  # to every replica; episodes keep running
            self.engines.publish(*self._weights())
        t3 = time.monotonic()
        self.step_no += 1
        self.summary["update_intervals"].append((wall_t1, time.time()))  # from batch taken to weights published
        if tc.mode == "sync":  # the barrier opens: the next round runs on the new weights
            self.round_id = f"{self.session}:{self.step_no}"
            if self.step_no < tc.max_steps:
                get(self.feed.open_round.remote(self.round_id), self.cfg.runtime.actor_timeout_s,
                    "opening the next round")
        trained = sum(not t.breaks for t in trajectories)  # one with breaks: consumed, skipped (trainer.algo.sao)
        self.counters.trained += trained
        self.trained += trained

        eng = self.engines.stats()
        now = time.monotonic()
        self.wait_total += t1 - t0
        metrics.update(_loop_metrics(entries, queue, self.counters, trainer, version_before, eng, self.eng_prev))
        metrics.update({"perf/trainer_idle_frac": (t1 - t0) / max(now - self.t_prev, 1e-9),
                        "perf/trajectories_per_hour": self.trained / max(now - self.t_loop, 1e-9) * 3600,
                        "time/wait_s": t1 - t0, "time/update_s": t2 - t1, "time/publish_s": t3 - t2,
                        "time/step_s": now - self.t_prev})
        t4 = time.monotonic()
        budget_s = tc.max_minutes * 60 if tc.max_minutes else float("inf")
        out_of_time = time.monotonic() - self.t_loop >= budget_s  # checked once: the step it is true is saved
        if self.step_no % tc.save_every == 0 or self.step_no == tc.max_steps or out_of_time:
            self.summary["checkpoint"] = str(self.save())
            metrics["time/checkpoint_s"] = time.monotonic() - t4
        self.metrics_log.log(self.step_no, metrics)
        self.log(progress_line(self.step_no, metrics)
                 + (f" | saved {Path(self.summary['checkpoint']).name}" if "time/checkpoint_s" in metrics else ""))
        self.eng_prev, self.t_prev = eng, now
        self.summary["steps"] = self.step_no
        if out_of_time:
            self.log(f"sao train: trainer.max_minutes={tc.max_minutes:g} reached at step {self.step_no}; stopping")
            self.stopped = True
        return metrics

    def state_dict(self) -> dict:
        """The run's state.json: the states of its parts (trainer, queue, counters, feed) and the session."""
        feed = get(self.feed.state_dict.remote(), self.cfg.runtime.actor_timeout_s, "task feed state")
        return {**self.trainer.state_dict(), **self.queue.state_dict(), "counters": self.counters.state_dict(),
                **feed, "mode": self.cfg.trainer.mode, "session": self.session, "time": time.time()}

    def save(self) -> Path:
        """Checkpoint this step (trainer.dist.checkpoint; the ranks write the sharded format); its directory."""
        run_dir, keep, state = self.cfg.run.dir, self.cfg.runtime.keep_checkpoints, self.state_dict()
        if isinstance(self.trainer, Ranks):
            return self.trainer.save_checkpoint(run_dir, self.step_no, tokenizer=self.tokenizer, state=state, keep=keep)
        return save_checkpoint(run_dir, self.step_no, policy=self.policy, critic=self.critic, trainer=self.trainer,
                               tokenizer=self.tokenizer, keep=keep, state=state)

    # --- finish -------------------------------------------------------------------------------------

    def finish(self) -> dict:
        """The run's summary (and its last line in the log); a death during the last step is reported too."""
        if self.pool is None:  # nothing to do
            return self.summary
        self.pool.check()
        counters, summary, wall = self.counters, self.summary, time.monotonic() - self.t_loop
        summary.update(
            wall_s=wall, trained=self.trained, trained_per_min=self.trained / max(wall, 1e-9) * 60,
            engine_idle_frac=_frac_idle(self.eng_prev["busy_s"] - self.eng0["busy_s"],
                                        self.eng_prev["up_s"] - self.eng0["up_s"]),
            trainer_idle_frac=self.wait_total / max(wall, 1e-9), policy_version=self.trainer.policy_version,
            counters=counters.state_dict(), consumed=list(self.queue.consumed), pending=list(self.queue.pending))
        kinds = f" ({kinds_line(counters.infra_kinds)})" if counters.infra_kinds else ""
        self.log(f"sao train: done, step {self.step_no}, policy version {self.trainer.policy_version}: {self.trained} "
                 f"trajectories trained in {wall:.0f}s ({summary['trained_per_min']:.1f}/min), engine idle "
                 f"{summary['engine_idle_frac']:.0%}, trainer idle {summary['trainer_idle_frac']:.0%}, "
                 f"{counters.infra_errors} infra errors{kinds} and {counters.dropped_stale} stale excluded; "
                 f"checkpoint {summary.get('checkpoint', '-')}")
        return summary
