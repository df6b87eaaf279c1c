"""Trace format and store: validation naming the field, atomic shards, round trip through datasets."""
import json
import os
import signal
import subprocess
import sys
import textwrap

import pyarrow.parquet as pq
import pytest

from harness.store import TraceStore, read_traces
from harness.trace import TraceError, Trajectory
from tests.support.traces import make_traj


def test_flat_views():
    t = make_traj()
    assert t.token_ids == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert t.is_action == [False] * 4 + [True] * 2 + [False] + [True] * 3
    assert t.logp_rollout == [None] * 4 + [-0.5, -1.25, None, -0.1, -0.2, -0.3]
    assert t.policy_version == [None] * 4 + [0, 0, None, 0, 1, 1]
    assert t.num_action_tokens == 5 and t.versions == [0, 1]


@pytest.mark.parametrize("mutate, field", [
    (lambda t: setattr(t.segments[1], "logp_rollout", [-0.5]), "logp_rollout"),
    (lambda t: setattr(t.segments[1], "policy_version", [0, 0, 0]), "policy_version"),
    (lambda t: setattr(t.segments[1], "logp_rollout", None), "logp_rollout"),
    (lambda t: setattr(t.segments[3], "policy_version", None), "policy_version"),
    (lambda t: setattr(t.segments[1], "logp_rollout", [0.5, -1.0]), "logp_rollout"),
    (lambda t: setattr(t, "status", "weird"), "status"),
    (lambda t: setattr(t, "breaks", [99]), "breaks"),
    (lambda t: setattr(t, "task_id", ""), "task_id"),
    (lambda t: setattr(t.segments[0], "logp_rollout", [0.0] * 4), "logp_rollout"),
])
def test_validation_names_the_field(mutate, field):
    t = make_traj()
    mutate(t)
    with pytest.raises(TraceError) as e:
        t.validate()
    assert field in str(e.value) and t.traj_id in str(e.value)


@pytest.mark.parametrize("status", ["infra_error", "agent_error", "stale"])
def test_reward_only_on_rewarded_statuses(status):
    with pytest.raises(TraceError, match="'reward' must be null"):
        make_traj(status=status, reward=0.0).validate()
    make_traj(status=status, reward=None).validate()


def test_store_round_trip(tmp_path):
    store = TraceStore(tmp_path / "run")
    a, b = make_traj("a"), make_traj("b", reward=None, status="infra_error")
    shard = store.write([a, b])
    assert shard.parent == tmp_path / "run" / "traces" and shard.suffix == ".parquet"
    back = list(store)
    assert [t.traj_id for t in back] == [a.traj_id, b.traj_id]
    assert back[0].segments[3].policy_version == [0, 1, 1]
    assert back[0].segments[1].logp_rollout == pytest.approx([-0.5, -1.25])
    assert back[0].grading == {"resolved": True} and back[0].timings == {"total_s": 1.5}
    assert back[1].reward is None and back[1].status == "infra_error"
    assert len(store) == 2 and store.traj_ids() == [a.traj_id, b.traj_id]
    assert read_traces(tmp_path / "run")[0].traj_id == a.traj_id


def test_store_rejects_invalid_and_writes_nothing(tmp_path):
    store = TraceStore(tmp_path)
    bad = make_traj(status="infra_error", reward=0.0)
    with pytest.raises(TraceError):
        store.write([make_traj(), bad])
    assert store.shards() == []


def test_round_trip_through_datasets(tmp_path):
    import datasets

    store = TraceStore(tmp_path)
    t = make_traj()
    store.write([t])
    store.write([make_traj("c")])
    ds = datasets.load_dataset("parquet", data_files=str(store.dir / "*.parquet"), split="train")
    assert ds.num_rows == 2
    row = ds[0] if ds[0]["traj_id"] == t.traj_id else ds[1]
    assert row["token_ids"] == t.token_ids and row["is_action"] == t.is_action
    assert row["policy_version"] == t.policy_version
    assert row["logp_rollout"][:4] == [None] * 4
    assert Trajectory.from_row(row).segments[3].token_ids == [8, 9, 10]


def test_interrupted_write_leaves_no_readable_partial_shard(tmp_path, monkeypatch):
    """An exception mid-write: no shard and no temporary file remain."""
    import harness.store as store_mod

    def half_write(table, f, **kw):
        f.write(b"PAR1 half a shard")
        raise OSError("disk on fire")

    monkeypatch.setattr(store_mod.pq, "write_table", half_write)
    store = TraceStore(tmp_path)
    with pytest.raises(OSError):
        store.write([make_traj()])
    assert store.shards() == [] and list(store.dir.iterdir()) == []


def test_kill_9_mid_write_leaves_no_partial_shard(tmp_path):
    """A writer killed with SIGKILL mid-write: readers see only complete shards."""
    script = textwrap.dedent(f"""
        import sys, time
        import harness.store as s
        from tests.support.traces import make_traj
        real = s.pq.write_table
        def slow(table, f, **kw):
            f.write(b"PAR1")
            f.flush()
            print("writing", flush=True)
            time.sleep(60)
        store = s.TraceStore({str(tmp_path)!r})
        store.write([make_traj("done")])
        s.pq.write_table = slow
        store.write([make_traj("never")])
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert proc.stdout.readline().strip() == "writing"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    store = TraceStore(tmp_path)
    assert [t.task_id for t in store] == ["done"]
    for shard in store.shards():
        pq.read_table(shard)  # every visible shard is complete
    assert store.clean_partial() == 1 and store.clean_partial() == 0


@pytest.mark.slow  # `sao` subprocesses
def test_trace_show_cli(tmp_path, project_root):
    store = TraceStore(tmp_path)
    shard = store.write([make_traj("first"), make_traj("second")])
    run = lambda *a: subprocess.run([sys.executable, "-m", "sao.cli", "trace", "show", *a],
                                    capture_output=True, text=True, cwd=project_root, timeout=120)
    r = run(str(shard), "--index", "1")
    assert r.returncode == 0, r.stderr
    assert "task=second" in r.stdout
    assert "[OBSERVATION 0 @0 n=4]" in r.stdout and "[ACTION 3 @7 n=3 v=[0, 1]" in r.stdout
    r = run(str(tmp_path), "--json")
    data = json.loads(r.stdout)
    assert data["task_id"] == "first" and [s["kind"] for s in data["segments"]] == [
        "observation", "action", "observation", "action"]
    r = run(str(shard), "--index", "5")
    assert r.returncode == 2 and "holds 2 trajectories" in r.stderr and "Traceback" not in r.stderr
    r = run(str(tmp_path / "nope.parquet"))
    assert r.returncode == 2 and "not found" in r.stderr
