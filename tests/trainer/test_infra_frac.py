"""`sao train`'s accounting of infra errors: `rollout/infra_frac` (cumulative), `rollout/infra/<kind>`, and the
rollout.max_infra_frac stop (a LoopError listing the kinds). The trace store and the queue are real; no Ray
actor runs (the pool's worker checks are stubbed), no Docker."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from sao_harness.envs.errors import CommandTimeout, EngineGone
from sao_harness.harness.store import TraceStore
from sao_harness.harness.trace import INFRA_KIND, Status
from sao_harness.sao.config import load_config
from sao_harness.tasks.grading.grade_status import GradeStatus
from sao_harness.trainer.run.loop import _loop_metrics
from sao_harness.trainer.run.queue import Counters, TraceQueue, over_infra_limit, take_async
from sao_harness.trainer.run.ray_utils import LoopError
from sao_harness.trainer.run.workers import WorkerPool
from tests.support.traces import make_traj

DOCKER = f"EngineGone: {EngineGone('Docker engine at unix:///x unreachable while starting sandbox s: refused')}"
TIMEOUT = f"CommandTimeout: {CommandTimeout('pytest', 600)}"
ENG = {"version": 1, "busy_s": 0.0, "up_s": 1.0}
TRAINER = SimpleNamespace(policy_optimizer_steps=1, critic_optimizer_steps=1)


def ok(i: int):
    return make_traj(f"t{i}", traj_id=f"id{i}")


def failed(i: int, why: str, kind: str | None = None):
    traj = make_traj(f"t{i}", reward=None, status=Status.INFRA_ERROR, traj_id=f"id{i}")
    traj.metadata[Status.INFRA_ERROR] = why
    if kind:
        traj.metadata[INFRA_KIND] = kind
    return traj


def step(queue: TraceQueue, counters: Counters, batch_size: int) -> dict:
    """One step's loop metrics, as trainer.run.loop logs them after take_async."""
    counters.step_counts = {}
    queue.poll()
    batch = take_async(queue, counters, batch_size, version=1, max_staleness=4)
    assert batch is not None
    return _loop_metrics(batch, queue, counters, TRAINER, 1, ENG, ENG)


def test_infra_frac_is_cumulative_and_kinds_are_counted(tmp_path):
    store = TraceStore(tmp_path)
    queue, counters = TraceQueue(store, consumed=[]), Counters()
    store.write([ok(i) for i in range(8)] + [failed(8, DOCKER), failed(9, DOCKER), failed(10, TIMEOUT)])
    m = step(queue, counters, 8)
    assert m["rollout/infra_frac"] == pytest.approx(3 / 11)
    assert (m["rollout/infra/docker_engine"], m["rollout/infra/timeout"]) == (2, 1)
    assert m["rollout/infra_errors"] == 3 and m["rollout/infra_errors_total"] == 3
    assert m["rollout/infra_failure_rate"] == pytest.approx(3 / 11)  # this step's: 3 of the 11 it consumed

    # the next step: 4 ok and a grading failure; a recorded kind wins over the reason's
    store.write([ok(i) for i in range(11, 15)] + [failed(15, f"grading: {GradeStatus.INFRA_FAILURE}"),
                                                  failed(16, "RuntimeError: x", kind="sandbox_oom")])
    m = step(queue, counters, 4)
    assert m["rollout/infra_frac"] == pytest.approx(5 / 17)  # over the run so far
    assert m["rollout/infra_failure_rate"] == pytest.approx(2 / 6) and m["rollout/infra_errors"] == 2
    assert {k: v for k, v in m.items() if k.startswith("rollout/infra/")} == {
        "rollout/infra/docker_engine": 2, "rollout/infra/timeout": 1, "rollout/infra/grading": 1,
        "rollout/infra/sandbox_oom": 1}
    assert m["rollout/infra_errors_total"] == 5

    # the kinds are saved in checkpoints; an older checkpoint without them still loads
    assert Counters(**counters.state_dict()).infra_kinds == counters.infra_kinds
    assert Counters(trained=3, infra_errors=1).infra_kinds == {}


def pool_over(tmp_path, *overrides) -> tuple[WorkerPool, TraceQueue]:
    """A WorkerPool (no actor started) over a store of 40 trajectories, every third an infra error (DOCKER and
    TIMEOUT in turn), batch size 4: min_episodes(4) = 20."""
    cfg = load_config(None, [f"run.root={tmp_path}", "trainer.batch_size=4", "runtime.poll_interval_s=0.01",
                             *overrides])
    store = TraceStore(tmp_path / "traces")
    store.write([failed(i, (DOCKER, TIMEOUT)[i // 3 % 2]) if i % 3 == 0 else ok(i) for i in range(40)])
    pool = WorkerPool(cfg, engines=None, feed=None, session="s", run_id="r", counters=Counters())
    pool.check = lambda: None  # no replica, no worker to watch
    return pool, TraceQueue(store, consumed=[])


def test_a_run_over_max_infra_frac_stops_with_the_kinds(tmp_path):
    pool, queue = pool_over(tmp_path)
    assert len(pool.next_batch(queue, 1, "r")) == 4  # 14 infra errors dropped + 4 trained = 18 consumed: too few
    with pytest.raises(LoopError) as caught:
        pool.next_batch(queue, 1, "r")  # 22 consumed: 14/22 is over 0.2
    assert str(caught.value).startswith("rollout/infra_frac 0.636 is over rollout.max_infra_frac 0.2 after 22 "
                                        "episodes (14 infra errors: docker_engine 7, timeout 7); the last: ")
    assert len(list(TraceStore(tmp_path / "traces"))) == 40  # every trace stays


@pytest.mark.parametrize("override", ["rollout.max_infra_frac=null", "rollout.max_infra_frac=0.7"])
def test_the_same_run_under_the_limit_or_without_one_goes_on(tmp_path, override):
    pool, queue = pool_over(tmp_path, override)
    batches = [pool.next_batch(queue, 1, "r") for _ in range(6)]  # the 26 ok ones: 6 batches of 4
    assert [len(b) for b in batches] == [4] * 6 and pool.counters.infra_kinds == {"docker_engine": 7, "timeout": 7}


def test_the_limit_waits_for_enough_episodes(tmp_path):
    store = TraceStore(tmp_path)
    store.write([failed(i, DOCKER) for i in range(3)] + [ok(i) for i in range(3, 20)])
    queue, counters = TraceQueue(store, consumed=[]), Counters()
    queue.poll()
    take_async(queue, counters, 4, version=1, max_staleness=4)  # 3 failures and 4 ok: a share of 3/7
    assert over_infra_limit(queue, counters, 0.2, batch_size=4) is None  # 7 < 20 consumed
    take_async(queue, counters, 13, version=1, max_staleness=4)
    assert len(queue.consumed) == 20 and over_infra_limit(queue, counters, 0.2, batch_size=4) is None  # 0.15
    assert over_infra_limit(queue, counters, 0.1, batch_size=4).startswith("rollout/infra_frac 0.15 is over ")
