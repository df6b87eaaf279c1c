"""`sao rollout` / `make rollout-swe`: episodes over a task source, N in parallel, one trace each.

- ``run_rollout(cfg, tasks)`` runs the tasks its caller loaded and pre-flighted once (``sao rollout``:
  ``harness.runner.load_tasks(cfg, "swe")``; ``sao eval``: ``eval.run.select_tasks``); it loads none itself,
  nor does the policy it starts (the expert engine is handed the same list).
- Each finished episode is written to the run's trace store at once (one shard per trajectory).
- Resume: a task that already has ``rollout.episodes_per_task`` trajectories that are not
  ``infra_error`` in the store is not run again.
- Infrastructure errors are retried up to ``rollout.max_retries`` times (``harness.runner``); only
  the last attempt is stored: an ``infra_error`` there is recorded with no reward, and counted by kind
  (``harness.infra``).
- ``rollout.max_infra_frac``: once ``harness.infra.min_episodes(rollout.workers)`` episodes have finished,
  a share of infra errors over it submits no new episode; those running finish and are stored, the
  summary is written, then ``TooManyInfraErrors`` (the CLI: one line, exit code 2) names the kinds.
- The run's sandboxes are removed on exit, Ctrl-C included (``envs.gc.run_scope``).
- The process is sized for ``rollout.workers`` episodes at once first (``harness.capacity``: open files,
  Docker connection pools).
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

import pyarrow.parquet as pq

from sao_harness.core.errors import UserError
from sao_harness.envs.engine import ensure_engine
from sao_harness.envs.gc import run_scope
from sao_harness.harness.capacity import size_process
from sao_harness.harness.config import HarnessConfig
from sao_harness.harness.engines import make_engine
from sao_harness.harness.episode import EpisodeContext
from sao_harness.harness.infra import kind_of, kinds_line, min_episodes, over_max_infra_frac
from sao_harness.harness.proxy import ProxyServer
from sao_harness.harness.proxy.template import template_from_config
from sao_harness.harness.proxy.tool_support import tool_support
from sao_harness.harness.runner import episode_function, run_with_retries
from sao_harness.harness.store import TraceStore
from sao_harness.harness.tiny_model import resolve_model_path
from sao_harness.harness.trace import Status, Trajectory
from sao_harness.tasks.images.prepare import prepare_task_images
from sao_harness.tasks.model import Task


class TooManyInfraErrors(UserError):
    """The share of infra errors passed rollout.max_infra_frac; the message lists their kinds."""


@dataclass
class RolloutStats:
    """Live counters of a rollout, also its summary."""

    total: int = 0
    skipped: int = 0
    done: int = 0
    running: int = 0
    resolved: int = 0
    graded: int = 0
    infra_errors: int = 0
    retries: int = 0
    turns: int = 0
    action_tokens: int = 0
    statuses: Counter = field(default_factory=Counter)
    infra_kinds: Counter = field(default_factory=Counter)  # harness.infra.KINDS of the infra errors
    last_infra_error: str | None = None
    started: float = field(default_factory=time.monotonic)

    def add(self, traj: Trajectory) -> None:
        self.done += 1
        self.statuses[traj.status] += 1
        self.turns += traj.turns
        self.action_tokens += traj.num_action_tokens
        if traj.status == Status.INFRA_ERROR:
            self.infra_errors += 1
            self.infra_kinds[kind_of(traj.metadata)] += 1
            self.last_infra_error = traj.metadata.get(Status.INFRA_ERROR)
        if traj.reward is not None:
            self.graded += 1
            self.resolved += traj.reward > 0

    def line(self) -> str:
        el = max(time.monotonic() - self.started, 1e-9)
        rate = f"{self.resolved / self.graded:.0%}" if self.graded else "-"
        mean_turns = f"{self.turns / self.done:.1f}" if self.done else "-"
        return (f"episodes {self.done}/{self.total - self.skipped} done, {self.running} running | resolved {rate} | "
                f"mean turns {mean_turns} | {self.action_tokens / el:.1f} tok/s | infra errors {self.infra_errors}"
                f"{self._kinds()}")

    def _kinds(self) -> str:
        return f" ({kinds_line(self.infra_kinds)})" if self.infra_errors else ""

    def over_max_infra_frac(self, max_frac: float | None, workers: int) -> str | None:
        """Why the rollout must stop (rollout.max_infra_frac, harness.infra): the share is infra errors / episodes
        finished (stored: the last attempt of each); None while it need not."""
        return over_max_infra_frac(self.infra_errors, self.done, self.infra_kinds, max_frac, min_episodes(workers),
                                   self.last_infra_error)

    def summary(self) -> str:
        """The closing line: episodes by status, resolved, infra errors by kind and retries, seconds."""
        retries = f"{self.retries} retr{'y' if self.retries == 1 else 'ies'}"
        return (f"summary: {self.done} episode(s): {dict(self.statuses)}; resolved {self.resolved}/{self.graded} "
                f"graded; {self.infra_errors} infra error(s){self._kinds()} after {retries}; "
                f"{time.monotonic() - self.started:.0f} s")


def completed_counts(store: TraceStore) -> Counter:
    """Per task, how many trajectories in the store count as done (everything but infra errors)."""
    counts: Counter = Counter()
    for shard in store.shards():
        table = pq.read_table(shard, columns=["task_id", "status"])
        for task_id, status in zip(table.column("task_id").to_pylist(), table.column("status").to_pylist()):
            if status != Status.INFRA_ERROR:
                counts[task_id] += 1
    return counts


def prepare_images(cfg: HarnessConfig, tasks, log=print) -> None:
    """The task images of ``tasks`` (``cfg.tasks.source``) exist locally: built from a task repo, never pulled."""
    prepare_task_images(cfg, ensure_engine(cfg.docker), cfg.tasks.source, tasks, pull=False, log=log)


def start_policy(cfg: HarnessConfig, tasks: list[Task] | None = None):
    """The engine and the started proxy that serves it on loopback; a chat template that cannot serve
    ``proxy.tool_format`` is a ``UserError`` before the engine starts (``harness.proxy.tool_support``).
    ``tasks``: the run's tasks, for an engine that serves them (``make_engine``; None: it loads the config's)."""
    from transformers import AutoTokenizer  # lazy: heavy

    path = resolve_model_path(cfg.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    verdict = tool_support(template_from_config(tokenizer, cfg.proxy), cfg.proxy, path)
    if not verdict.ok:
        raise UserError(verdict.message())
    engine = make_engine(cfg, tasks=tasks)
    proxy = ProxyServer(engine, tokenizer, cfg)
    proxy.start(port=0)
    return engine, proxy


def _episodes_to_run(cfg: HarnessConfig, tasks: list[Task], log) -> tuple[TraceStore, list[Task], RolloutStats]:
    """The run's trace store (partial shards cleaned), the episodes still to run (one entry per episode:
    ``rollout.episodes_per_task`` less those the store holds), and the stats counting the skipped ones."""
    store = TraceStore(cfg.run.dir)
    store.clean_partial()
    done = completed_counts(store)
    per_task = cfg.rollout.episodes_per_task
    todo = [t for t in tasks for _ in range(max(0, per_task - done.get(t.instance_id, 0)))]
    stats = RolloutStats(total=len(tasks) * per_task)
    stats.skipped = stats.total - len(todo)
    if stats.skipped:
        log(f"resuming {cfg.run.dir}: {stats.skipped} episode(s) already in the trace store")
    return store, todo, stats


def run_rollout(cfg: HarnessConfig, tasks: list[Task], *, engine=None, proxy=None, grade: bool = True,
                on_trajectory=None, images_ready: bool = False, log=print) -> RolloutStats:
    """Run ``rollout.episodes_per_task`` episodes of each of ``tasks`` with the settings of ``cfg``.

    ``tasks``: loaded and pre-flighted once by the caller (``tasks.preflight``: gradable, image there or
    buildable; module doc), in order; loaded again by nothing here. ``engine``/``proxy`` may be given (tests,
    scripted policy); else they are started (``start_policy``) and stopped at the end. ``grade=False`` leaves
    rewards unset (``eval`` grades in bulk); ``on_trajectory(traj, shard)`` is called after each trajectory is
    stored; ``images_ready``: the caller built or pulled the tasks' images (``sao eval``), not done again.
    ``TooManyInfraErrors`` after the summary when the run stopped on ``rollout.max_infra_frac`` (module doc)."""
    runnable = list(tasks)
    store, todo, stats = _episodes_to_run(cfg, runnable, log)
    if not todo:
        log("nothing to do: every task has its trajectories")
        return stats
    size_process(cfg.rollout.workers, log=log)  # open files, Docker connections (harness.capacity)
    if not images_ready:
        prepare_images(cfg, {t.instance_id: t for t in todo}.values(), log=log)
    own = proxy is None
    if own:
        engine, proxy = start_policy(cfg, runnable)
    run_id = f"{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    ctx = EpisodeContext(cfg=cfg, proxy=proxy, run_id=run_id, grade=grade)
    lock = threading.Lock()
    run_swe = episode_function("swe")

    def count_retry(traj: Trajectory) -> None:  # only the last attempt is stored
        if not traj.metadata["last_attempt"]:
            with lock:
                stats.retries += 1

    stopped = None  # why the rollout stopped early (rollout.max_infra_frac)
    log(f"rollout: {len(todo)} episode(s), {cfg.rollout.workers} in parallel, traces -> {store.dir}")
    try:
        with run_scope(run_id), ThreadPoolExecutor(cfg.rollout.workers) as pool:
            def one(task):
                with lock:
                    stats.running += 1
                try:
                    return run_with_retries(run_swe, task, ctx, cfg.rollout.max_retries, on_attempt=count_retry)
                finally:
                    with lock:
                        stats.running -= 1

            futures = {pool.submit(one, t): t for t in todo}
            try:
                for fut in as_completed(futures):
                    if fut.cancelled():  # not started: the run stopped (rollout.max_infra_frac)
                        continue
                    traj = fut.result()
                    shard = store.write([traj])
                    with lock:
                        stats.add(traj)
                    if on_trajectory is not None:
                        on_trajectory(traj, shard)
                    log(f"[{traj.task_id}] {traj.status} reward={traj.reward} turns={traj.turns} -> {shard.name}"
                        f"\n  {stats.line()}")
                    if stopped is None and (stopped := stats.over_max_infra_frac(cfg.rollout.max_infra_frac,
                                                                                 cfg.rollout.workers)):
                        cancelled = sum(f.cancel() for f in futures)  # the running ones finish and are stored
                        log(f"rollout: stopping, {cancelled} episode(s) not started: {stopped}")
            except BaseException:  # Ctrl-C, or a trace the disk refused (TraceWriteError): no episode starts now
                for f in futures:
                    f.cancel()
                raise
    finally:
        if own:
            proxy.stop()
            engine.close()
    log(f"{stats.summary()}; traces in {store.dir}")
    if stopped is not None:
        raise TooManyInfraErrors(stopped)
    return stats
