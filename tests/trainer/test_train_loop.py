"""`sao train`: the async SAO loop and the sync group baseline on the simulated environment.

Real Ray actors (one local Ray session for the module), the tiny model in the hf engine, real
generations through the proxy; the simulated test-bed replaces Docker (harness.testbeds.simulated).
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from sao_harness.harness.store import TraceStore
from sao_harness.harness.trace import INFRA_ERRORS, Segment, Status, Trajectory
from sao_harness.sao.config import load_config
from sao_harness.trainer.dist.checkpoint import latest_checkpoint, list_checkpoints, read_state
from sao_harness.trainer.report.metrics import family, read_metrics

pytestmark = pytest.mark.slow  # Ray actors and whole training runs: 5-40 s each


@pytest.fixture(scope="module")
def ray_address(project_root):
    """One local Ray (127.0.0.1 only) for the module; runs in this process and in subprocesses join it."""
    import ray

    from sao_harness.trainer.run.ray_utils import start_ray

    start_ray(None, log=lambda m: None)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def overrides(tmp_path, name, project_root, *extra):
    return [f"run.root={tmp_path}", f"run.name={name}", f"model.cache_dir={project_root / '.cache/sao'}",
            "trainer.env=simulated", "sampling.max_tokens=8", "testbed.simulated.turns_median=3",
            "testbed.simulated.env_sleep_s=0.05", "runtime.poll_interval_s=0.05", "runtime.batch_timeout_s=120",
            "runtime.actor_timeout_s=120", "runtime.publish_timeout_s=60", "trainer.critic_steps=2",
            "trainer.critic_warmup_steps=0", "trainer.lr=1e-4", "trainer.critic_lr=1e-4", "rollout.max_retries=0",
            *extra]


def sim_cfg(tmp_path, name, project_root, *extra):
    return load_config(project_root / "configs/local.yaml", overrides(tmp_path, name, project_root, *extra))


def stored(run_dir) -> dict[str, Trajectory]:
    return {t.traj_id: t for t in TraceStore(run_dir)}


def test_async_versions_critic_steps_infra_errors_and_a_dead_worker(ray_address, project_root, tmp_path):
    """One async run: versions advance per step and reach the trajectories (some span an update);
    the staleness bound (0 here: a trajectory must be on-policy) drops and counts; K=2 critic steps
    per policy step; injected infra errors are counted and never reach the update; a rollout worker
    killed mid-run is reported and replaced."""
    import ray

    from sao_harness.trainer.run.loop import train

    cfg = sim_cfg(tmp_path, "async", project_root, "trainer.max_steps=4", "trainer.batch_size=4",
                  "rollout.workers=3", "testbed.simulated.infra_error_rate=0.3", "trainer.save_every=2",
                  "trainer.max_staleness=0", "rollout.max_infra_frac=null")  # 0.3 injected: over the default limit
    seen: list[dict] = []
    lines: list[str] = []

    def update(trainer, trajectories):
        seen.append({"version": trainer.policy_version, "ids": [t.traj_id for t in trajectories],
                     "oldest": [t.versions[0] for t in trajectories],
                     "statuses": [t.status for t in trajectories], "rewards": [t.reward for t in trajectories]})
        if len(seen) == 2:  # kill a rollout worker while the loop runs
            session = trajectories[0].metadata["assignment"].split(":")[0]
            ray.kill(ray.get_actor(f"sao-worker-{session}-w1"))
        return trainer.update(trajectories)

    summary = train(cfg, update_fn=update, log=lines.append)
    run_dir = cfg.run.dir
    records = read_metrics(run_dir)
    trajs = stored(run_dir)

    # the engine's version increases with each step, and the trainer's counters follow: K = 2
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert [r["rollout/engine_version"] for r in records] == [1, 2, 3, 4]
    assert [r["policy/optimizer_steps"] for r in records] == [1, 2, 3, 4]
    assert [r["critic/optimizer_steps"] for r in records] == [2, 4, 6, 8]
    assert [s["version"] for s in seen] == [0, 1, 2, 3]
    # later trajectories carry the new versions; a trajectory running across an update carries both
    versions = {v for t in trajs.values() for v in t.versions}
    assert {0, 1, 2, 3} <= versions
    assert any(len(t.versions) >= 2 for t in trajs.values())
    # infra errors: stored, counted, never in a batch
    infra = {tid for tid, t in trajs.items() if t.status == Status.INFRA_ERROR}
    assert infra and all(trajs[i].reward is None for i in infra)
    trained = [i for s in seen for i in s["ids"]]
    assert not infra & set(trained)
    assert all(st == Status.OK and r is not None for s in seen for st, r in zip(s["statuses"], s["rewards"]))
    consumed = summary["consumed"]
    assert summary["counters"][INFRA_ERRORS] == len(infra & set(consumed)) > 0
    assert records[-1]["rollout/infra_errors_total"] == summary["counters"][INFRA_ERRORS]
    assert len(trained) == 16 and len(set(trained)) == 16 and len(consumed) == len(set(consumed))
    # the staleness bound: what reached the update was within it; the rest was dropped and counted
    assert all(s["version"] - v <= 0 for s in seen for v in s["oldest"])
    stale = {i for i in consumed if trajs[i].reward is not None} - set(trained)
    assert summary["counters"]["dropped_stale"] == len(stale) == records[-1]["rollout/dropped_stale_total"] > 0
    assert all(len(trajs[i].versions) >= 2 or trajs[i].versions[0] < 3 for i in stale)
    # the dead worker was reported and replaced; the run finished
    assert summary["counters"]["worker_deaths"] == 1
    assert any("rollout worker w1 died" in line for line in lines)
    assert any(line.startswith("step 4 | policy/version 4 | rollout/reward_mean ")
               and "| critic/explained_variance " in line and "| policy/dis_masked " in line
               and "| perf/engine_idle_frac " in line for line in lines)
    # checkpoints every 2 steps and at the end; idle fractions are fractions
    assert [p.name for p in list_checkpoints(run_dir)] == ["step-000002", "step-000004"]
    assert 0 <= summary["engine_idle_frac"] <= 1 and 0 <= summary["trainer_idle_frac"] <= 1
    for key in ("rollout/queue_depth", "rollout/dropped_stale", "perf/engine_idle_frac", "perf/trainer_idle_frac",
                "rollout/staleness_max", "critic/explained_variance", "policy/dis_masked_low", "loss/value_loss",
                "rollout/reward_mean", "perf/trajectories_per_hour", "time/step_s", "time/wait_s",
                "time/update_s", "time/publish_s"):
        assert key in records[-1], key
    # every logged key, the loop's and the update's, is in one of the six families
    assert not {k for r in records for k in r if k not in ("step", "time") and family(k) is None}
    assert "time/checkpoint_s" in records[1] and "time/checkpoint_s" not in records[0]  # saved at step 2


def _traj(i: int, versions: list[int], status=Status.OK, reward=1.0) -> Trajectory:
    return Trajectory(task_id=f"t{i}", traj_id=f"id{i}", status=status, reward=reward if status == Status.OK else None,
                      segments=[Segment("observation", [1, 2, 3]),
                                Segment("action", [4] * len(versions), [-1.0] * len(versions), versions)])


def test_staleness_bound_drops_and_counts(tmp_path):
    """The queue drops (and counts) trajectories older than max_staleness versions, counted from the
    oldest token, and unrewarded ones; they never enter a batch."""
    from sao_harness.trainer.run.queue import Counters, TraceQueue, take_async

    store = TraceStore(tmp_path)
    store.write([_traj(0, [0, 3]), _traj(1, [1, 1]), _traj(2, [2]), _traj(3, [3]), _traj(4, [3], Status.INFRA_ERROR)])
    store.write([_traj(5, [2, 3])])
    queue, counters = TraceQueue(store, consumed=[]), Counters()
    assert queue.poll() == 6
    assert take_async(queue, counters, 4, version=3, max_staleness=1) is None  # only 3 usable: ids 2, 3, 5
    assert counters.dropped_stale == 2 and counters.infra_errors == 1 and counters.excluded_unrewarded == 1
    assert queue.consumed == ["id0", "id1", "id4"]
    store.write([_traj(6, [3])])
    assert queue.poll() == 1 and queue.poll() == 0
    batch = take_async(queue, counters, 4, version=3, max_staleness=1)
    assert [e.traj_id for e in batch] == ["id2", "id3", "id5", "id6"]
    assert [t.traj_id for t in queue.load(batch)] == ["id2", "id3", "id5", "id6"]
    assert not queue.pending
    # a resumed queue skips what the checkpoint consumed
    again = TraceQueue(store, consumed=queue.consumed[:4])
    assert again.poll() == 3 and sorted(again.pending) == ["id3", "id5", "id6"]


def test_sync_mode_waits_for_whole_groups(ray_address, project_root, tmp_path):
    """trainer.mode=sync (GRPO + DIS): every batch is whole groups of G rollouts per task, and no
    episode starts between the start of an update and the publication of its weights."""
    from sao_harness.trainer.run.loop import train

    cfg = sim_cfg(tmp_path, "sync", project_root, "trainer.mode=sync", "trainer.group_size=2",
                  "trainer.batch_size=4", "trainer.max_steps=3", "rollout.workers=3", "trainer.advantage=grpo",
                  "trainer.policy_loss=dis", "testbed.simulated.turns_sigma=0.5", "trainer.save_every=3")
    batches: list[list[Trajectory]] = []

    def update(trainer, trajectories):
        batches.append(trajectories)
        return trainer.update(trajectories)

    summary = train(cfg, update_fn=update, log=lambda m: None)
    assert len(batches) == 3
    for i, batch in enumerate(batches):
        assert len(batch) == 4
        assert sorted(Counter(t.task_id for t in batch).values()) == [2, 2]
        assert {v for t in batch for v in t.versions} == {i}  # on-policy: the round ran on version i
    starts = [t.metadata["t_start"] for t in stored(cfg.run.dir).values()]
    assert len(starts) >= 12
    for begin, end in summary["update_intervals"]:
        assert not [s for s in starts if begin <= s <= end], "an episode started while an update ran"
    assert read_metrics(cfg.run.dir)[-1]["rollout/engine_version"] == 3


def test_kill9_then_resume_loses_and_duplicates_nothing(ray_address, project_root, tmp_path):
    """`sao train` killed with SIGKILL after its second checkpoint, then run again on the same run
    directory: it resumes, and every stored trajectory is consumed exactly once in the final lineage
    or still pending; what the killed run consumed after its checkpoint is consumed again."""
    run_dir = tmp_path / "kill"
    cmd = [sys.executable, "-m", "sao_harness.sao.cli", "train", "--config", str(project_root / "configs/local.yaml"),
           *overrides(tmp_path, "kill", project_root, "trainer.max_steps=6", "trainer.batch_size=3",
                      "trainer.save_every=1", "rollout.workers=3", f"runtime.ray_address={ray_address}")]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(tmp_path / "first.log", "w") as out:
        proc = subprocess.Popen(cmd, cwd=project_root, stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 180
        while (ck := latest_checkpoint(run_dir)) is None or read_state(ck)["step"] < 2:
            assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no second checkpoint within 180 s"
            time.sleep(0.1)
        time.sleep(random.uniform(0.0, 0.5))  # somewhere in the next step
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    killed_at = read_state(latest_checkpoint(run_dir))
    assert killed_at["step"] < 6, "the first run finished before the kill"
    before = set(TraceStore(run_dir).traj_ids())

    second = subprocess.run(cmd, cwd=project_root, capture_output=True, text=True, timeout=300, env=env)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert f"resuming {run_dir} from step-{killed_at['step']:06d}" in second.stdout

    final = read_state(latest_checkpoint(run_dir))
    assert final["step"] == 6 and final["policy_version"] == 6
    consumed = final["consumed"]
    store_ids = TraceStore(run_dir).traj_ids()
    assert len(store_ids) == len(set(store_ids))
    assert len(consumed) == len(set(consumed)), "a trajectory was consumed twice"
    assert set(consumed) <= set(store_ids)
    assert before <= set(store_ids), "a stored trajectory was lost"
    assert consumed[:len(killed_at["consumed"])] == killed_at["consumed"]  # one lineage
    leftover = before - set(killed_at["consumed"])  # stored before the kill, not in the checkpoint's lineage
    if leftover:  # the kill may land before any episode ended after the checkpoint
        assert leftover & set(consumed), "the killed run's later trajectories were not used"
    assert final["counters"]["trained"] == 18
    assert not list((run_dir / "checkpoints").glob(".tmp-*"))
    assert not list((run_dir / "traces").glob(".shard-*"))


def test_an_engine_that_keeps_dying_ends_the_run_with_a_clear_error(ray_address, project_root, tmp_path):
    """A dead engine replica is reported and replaced (the run goes on); after 3 x engine.replicas
    deaths the run ends with a `LoopError` saying so."""
    import ray

    from sao_harness.trainer.run.loop import train
    from sao_harness.trainer.run.ray_utils import LoopError

    cfg = sim_cfg(tmp_path, "dead", project_root, "trainer.max_steps=8", "trainer.batch_size=2", "rollout.workers=2",
                  "testbed.simulated.engine_s=0.02")
    lines: list[str] = []

    def update(trainer, trajectories):
        session = trajectories[0].metadata["assignment"].split(":")[0]
        names = [n for n in ray.util.list_named_actors() if n.startswith(f"sao-engine-{session}-r0")]
        victim = ray.get_actor(sorted(names)[-1])  # the newest: r0, r0.1, r0.2, ...
        ray.kill(victim)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # dead for sure before the publish looks (ray.kill is asynchronous)
            try:
                ray.get(victim.stats.remote(), timeout=5)
            except ray.exceptions.RayActorError:
                break
            time.sleep(0.1)
        time.sleep(0.3)
        return trainer.update(trajectories)

    t0 = time.monotonic()
    with pytest.raises(LoopError, match=r"4 engine replica deaths; the last: r0"):
        train(cfg, update_fn=update, log=lines.append)
    assert any(line.startswith("engine replica r0 died") for line in lines)
    assert any(line.startswith("engine replica r0.1 serving policy version 1") for line in lines)
    assert time.monotonic() - t0 < 240


def test_one_train_per_run_directory(project_root, tmp_path):
    import fcntl

    from sao_harness.core.errors import UserError
    from sao_harness.trainer.run.loop import train

    cfg = sim_cfg(tmp_path, "locked", project_root)
    cfg.run.dir.mkdir(parents=True)
    with open(cfg.run.dir / ".train.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(UserError, match="in use by another"):
            train(cfg)


def test_train_cli_rejects_a_sync_batch_of_partial_groups(project_root, tmp_path):
    result = subprocess.run([sys.executable, "-m", "sao_harness.sao.cli", "train", "--config",
                             str(project_root / "configs/local.yaml"), f"run.root={tmp_path}",
                             "trainer.mode=sync", "trainer.group_size=3", "trainer.batch_size=4"],
                            cwd=project_root, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "must be a multiple of trainer.group_size" in result.stderr


def test_max_minutes_stops_the_loop_and_saves_the_last_step(ray_address, project_root, tmp_path):
    """trainer.max_minutes: the first step that ends past the budget is checkpointed and the run stops,
    long before max_steps; without it the same run would go on (sao learn gives each arm the same budget)."""
    from sao_harness.trainer.run.loop import train

    cfg = sim_cfg(tmp_path, "budget", project_root, "trainer.max_steps=1000", "trainer.save_every=1000",
                  "trainer.max_minutes=0.1", "trainer.batch_size=2", "testbed.simulated.engine_s=0.01")
    summary = train(cfg, log=lambda m: None)
    assert 1 <= summary["steps"] < 1000
    assert summary["wall_s"] >= 6.0
    last = latest_checkpoint(cfg.run.dir)
    assert last is not None and read_state(last)["step"] == summary["steps"]


def test_a_trajectory_with_breaks_neither_kills_the_run_nor_comes_back(ray_address, project_root, tmp_path):
    """A rewarded trajectory with a history break first in the stream (before: build_batch raised,
    `sao train` died, and a resume read it again): the step skips it and logs rollout/break_frac,
    the checkpoint consumes it (a resume never reads it again), and it is not counted as trained."""
    from sao_harness.trainer.run.loop import train

    cfg = sim_cfg(tmp_path, "breaks", project_root, "trainer.max_steps=1", "trainer.batch_size=2",
                  "rollout.workers=1", "testbed.simulated.engine_s=0.01")
    broken = Trajectory(task_id="t", traj_id="broken", status=Status.OK, reward=1.0, turns=2, breaks=[5], segments=[
        Segment("observation", [1, 2, 3]), Segment("action", [4, 5], [-1.0] * 2, [0] * 2),
        Segment("observation", [1, 2, 6]), Segment("action", [7], [-1.0], [0])])
    TraceStore(cfg.run.dir).write([broken])
    summary = train(cfg, log=lambda m: None)
    assert summary["steps"] == 1
    (record,) = read_metrics(cfg.run.dir)
    assert (record["rollout/break_frac"], record["rollout/trajectories"]) == (0.5, 1.0)
    state = read_state(latest_checkpoint(cfg.run.dir))
    assert state["consumed"][0] == "broken" and state["counters"]["trained"] == 1


def test_a_run_leaves_no_partial_shard_of_a_worker_stopped_mid_write(ray_address, project_root, tmp_path):
    """The run's close stops the workers, which may be writing a shard (a `.shard-*.tmp` a killed writer leaves),
    then removes such files; the stand-in here is one written during the last update."""
    from sao_harness.trainer.run.loop import train

    cfg = sim_cfg(tmp_path, "partial", project_root, "trainer.max_steps=2", "trainer.batch_size=2",
                  "trainer.save_every=1000", "testbed.simulated.engine_s=0.01")
    stray = cfg.run.dir / "traces" / ".shard-0000-cut.parquet.0a1b2c3d.tmp"

    def update(trainer, trajectories):
        stray.write_bytes(b"PAR1 half a shard")  # as a worker killed between its write and its rename leaves it
        return trainer.update(trajectories)

    train(cfg, update_fn=update, log=lambda m: None)
    assert len(TraceStore(cfg.run.dir).traj_ids()) >= 4 and not stray.exists()
