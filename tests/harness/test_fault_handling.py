"""What the faults of bench/bench_faults.py found, fixed and held here without Docker or Ray (issue 37):

- a shard the disk refuses is a `TraceWriteError` that leaves nothing behind and touches no other shard;
- `sao rollout` stops at the first trace it cannot write, starts no further episode, and resumes;
- a rollout worker that dies mid-episode in `sao train`: its task runs again within `rollout.max_retries`
  (async too, not only sync) and the lost attempt is stored as an `infra_error` with no reward.
"""
from __future__ import annotations

import errno
import threading
import time
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest

from sao_harness.harness import store as store_module
from sao_harness.harness.rollout import run_rollout
from sao_harness.harness.store import TraceStore, TraceWriteError
from sao_harness.harness.trace import Status, Trajectory
from sao_harness.sao.config import load_config
from sao_harness.trainer.run.actors import TaskFeed
from sao_harness.trainer.run.queue import Counters, TraceQueue, take_async
from sao_harness.trainer.run.workers import WorkerPool
from tests.support.rollout_stub import stub_rollout
from tests.support.traces import make_traj

Feed = TaskFeed.__ray_actor_class__  # the plain class behind the Ray actor


def full_disk_after(monkeypatch, n_ok: int, on_fail=lambda: None) -> SimpleNamespace:
    """`atomic_write` as the store calls it, which fails with ENOSPC after `disk.n_ok` writes (half a file
    written, then removed, as atomic_write does; `on_fail()` first); `disk.n_ok = None` frees the disk."""
    real, calls = store_module.atomic_write, []
    disk = SimpleNamespace(n_ok=n_ok)

    def write(path, fn):
        calls.append(path)
        if disk.n_ok is not None and len(calls) > disk.n_ok:
            tmp = path.with_name(f".{path.name}.x.tmp")
            tmp.write_bytes(b"PAR1 half")  # what a writer leaves when the disk fills mid-write...
            on_fail()
            try:
                raise OSError(errno.ENOSPC, "No space left on device")
            finally:
                tmp.unlink()  # ...and atomic_write removes
        return real(path, fn)

    monkeypatch.setattr(store_module, "atomic_write", write)
    return disk


def test_a_shard_the_disk_refuses_is_a_trace_write_error_and_the_others_stay_whole(monkeypatch, tmp_path):
    store = TraceStore(tmp_path)
    first = store.write([make_traj("t0", traj_id="a")])
    before = first.read_bytes()
    full_disk_after(monkeypatch, 0)
    with pytest.raises(TraceWriteError, match=r"cannot write a trace shard to .*No space left on device.*resume"):
        store.write([make_traj("t1", traj_id="b")])
    assert store.shards() == [first] and first.read_bytes() == before
    assert [t.traj_id for t in store] == ["a"] and pq.read_table(first).num_rows == 1
    assert not list(store.dir.glob(".*"))  # no temporary file left


def fake_rollout(monkeypatch, tmp_path, n: int = 6):
    """run_rollout over t0..t<n-1>, one worker, each episode starting once the one before is stored (`run.gate`;
    a new one per run); `run.started`: the episodes that started."""
    tasks = [SimpleNamespace(instance_id=f"t{i}", image="img:1") for i in range(n)]

    def episode(task, ctx, eid):
        run.started.append(task.instance_id)
        deadline = time.monotonic() + 30
        while not run.gate.acquire(timeout=0.05) and time.monotonic() < deadline:
            if run.failed_at is not None and time.monotonic() - run.failed_at > 0.5:
                break  # the one running when the write failed ends (the run stopped: its trace is not kept)
        return Trajectory(task_id=task.instance_id, traj_id=eid, status=Status.OK, reward=1.0)

    stub_rollout(monkeypatch, episode)
    cfg = load_config(None, [f"run.root={tmp_path}", "run.name=r", "rollout.workers=1", "rollout.max_retries=0"])

    def run():
        run.gate, run.started, run.failed_at = threading.Semaphore(1), [], None
        return run_rollout(cfg, tasks, engine=object(), proxy=object(), log=lambda line: None,
                           on_trajectory=lambda traj, shard: run.gate.release())

    return cfg, run


def test_a_rollout_stops_at_the_first_trace_it_cannot_write_and_resumes(monkeypatch, tmp_path):
    """Before the fix the error came only after every queued episode had run (the pool waited for them all),
    as a bare OSError; now no episode starts after it, the message says what to do, and the rerun finishes."""
    cfg, run = fake_rollout(monkeypatch, tmp_path)
    disk = full_disk_after(monkeypatch, 2, on_fail=lambda: setattr(run, "failed_at", time.monotonic()))
    with pytest.raises(TraceWriteError, match="No space left on device"):
        run()
    assert run.started in (["t0", "t1", "t2"], ["t0", "t1", "t2", "t3"])  # never t4, t5: not started
    assert [t.task_id for t in TraceStore(cfg.run.dir)] == ["t0", "t1"]
    disk.n_ok = None  # space freed: the same command again
    stats = run()
    assert stats.skipped == 2 and stats.done == 4 and stats.infra_errors == 0
    assert sorted(t.task_id for t in TraceStore(cfg.run.dir)) == [f"t{i}" for i in range(6)]


def _feed(mode: str):
    return Feed([SimpleNamespace(instance_id=f"t{i}") for i in range(3)], seed=0, mode=mode, group_size=2,
                groups_per_round=1, session="s")


def _with_replica(feed):
    feed.add_replica("r0", engine=None, url="http://127.0.0.1:1/r0", node_ip="127.0.0.1")
    return feed


def test_a_dead_workers_task_runs_again_within_max_retries_in_async_mode():
    feed = _with_replica(_feed("async"))
    task = feed.next("w0")["task"]
    item = feed.release("w0", max_retries=1)
    assert item["task"] is task and item["deaths"] == 1 and item["requeued"]
    again = feed.next("w1")  # the replacement (or any worker) takes it first
    assert again["task"] is task and again["deaths"] == 1
    last = feed.release("w1", max_retries=1)
    assert last["deaths"] == 2 and not last["requeued"]  # past rollout.max_retries: not again
    assert feed.next("w2")["task"] is not task or feed.state()["queued"] == 0
    assert feed.release("w9", max_retries=1) is None  # a worker with no assignment


def test_a_dead_workers_task_always_runs_again_in_sync_mode():
    feed = _with_replica(_feed("sync"))
    feed.open_round("s:0")
    first = feed.next("w0")
    item = feed.release("w0", max_retries=0)
    assert item["requeued"] and feed.next("w1")["group"] == first["group"]  # the round needs all of it


def test_the_episode_of_a_dead_worker_is_stored_as_an_infra_error_and_counted(tmp_path):
    cfg = load_config(None, [f"run.root={tmp_path}", "run.name=t"])
    lines: list[str] = []
    pool = WorkerPool(cfg, engines=None, feed=None, session="s", run_id="run", counters=Counters(), log=lines.append)
    item = {"task": SimpleNamespace(instance_id="t1"), "assignment": "s:4", "round": None, "group": None,
            "deaths": 1, "requeued": True}
    pool._store_abandoned("w0", "ActorDiedError: the worker process died", item)
    [traj] = list(TraceStore(cfg.run.dir))
    assert traj.status == Status.INFRA_ERROR and traj.reward is None and traj.task_id == "t1"
    assert traj.metadata["last_attempt"] is False and traj.metadata["attempt"] == 0
    assert "rollout worker w0 died" in traj.metadata[Status.INFRA_ERROR]
    assert any("runs again" in line for line in lines)
    counters = Counters()
    queue = TraceQueue(TraceStore(cfg.run.dir), [])
    queue.poll()
    assert take_async(queue, counters, 1, 0, 0) is None
    assert counters.infra_errors == 1 and counters.excluded_unrewarded == 1  # never trained, never a 0
