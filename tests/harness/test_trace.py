"""Trace format and store: validation naming the field, atomic shards, round trip through datasets; the
status enum (Parquet and JSON keep its values, no status literal outside it)."""
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sao_harness.harness.store import TraceStore, read_shard, read_traces
from sao_harness.harness.trace import EXCLUDED, REWARDED, SCHEMA, Status, TraceError, Trajectory, to_table
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


@pytest.mark.parametrize("status", sorted(EXCLUDED))
def test_reward_only_on_rewarded_statuses(status):
    with pytest.raises(TraceError, match="'reward' must be null"):
        make_traj(status=status, reward=0.0).validate()
    make_traj(status=status, reward=None).validate()


def test_store_round_trip(tmp_path):
    store = TraceStore(tmp_path / "run")
    a, b = make_traj("a"), make_traj("b", reward=None, status=Status.INFRA_ERROR)
    shard = store.write([a, b])
    assert shard.parent == tmp_path / "run" / "traces" and shard.suffix == ".parquet"
    back = list(store)
    assert [t.traj_id for t in back] == [a.traj_id, b.traj_id]
    assert back[0].segments[3].policy_version == [0, 1, 1]
    assert back[0].segments[1].logp_rollout == pytest.approx([-0.5, -1.25])
    assert back[0].grading == {"resolved": True} and back[0].timings == {"total_s": 1.5}
    assert back[1].reward is None and back[1].status is Status.INFRA_ERROR
    assert len(store) == 2 and store.traj_ids() == [a.traj_id, b.traj_id]
    assert read_traces(tmp_path / "run")[0].traj_id == a.traj_id


def test_store_rejects_invalid_and_writes_nothing(tmp_path):
    store = TraceStore(tmp_path)
    bad = make_traj(status=Status.INFRA_ERROR, reward=0.0)
    with pytest.raises(TraceError):
        store.write([make_traj(), bad])
    assert store.shards() == []


# --- the status enum ---------------------------------------------------------------------------------
def test_every_status_round_trips_through_parquet_and_json(tmp_path):
    """Each Status is written as its plain value and read back as the member."""
    trajs = [make_traj(s.value, status=s, reward=0.0 if s in REWARDED else None) for s in Status]
    shard = TraceStore(tmp_path).write(trajs)
    assert pq.read_table(shard).column("status").to_pylist() == [s.value for s in Status]
    back = read_shard(shard)
    assert [t.status for t in back] == list(Status) and all(type(t.status) is Status for t in back)
    assert json.dumps([*Status, {Status.INFRA_ERROR: 1}]) == json.dumps([*(s.value for s in Status),
                                                                          {Status.INFRA_ERROR.value: 1}])
    assert Trajectory(task_id="t", status=Status.AGENT_ERROR.value).status is Status.AGENT_ERROR


def test_an_unknown_status_fails_naming_the_trajectory_and_the_value(tmp_path):
    t = make_traj()
    shard = tmp_path / "old.parquet"
    pq.write_table(pa.Table.from_pylist([t.to_row() | {"status": "retired"}], schema=SCHEMA), shard)
    with pytest.raises(TraceError, match=f"trajectory {t.traj_id} .*'status' is 'retired', expected one of ok, "):
        read_shard(shard)
    with pytest.raises(TraceError, match="'retired'"):
        Trajectory(task_id="t", status="retired")
    assert to_table([t]).column("status").to_pylist() == [Status.OK.value]


NEEDLE = "\x22infra"  # a double quote, then infra (spelt so that this file passes its own check)
ENUM_FILES = {"harness/trace.py", "tasks/grading/grade_status.py"}  # Status, GradeStatus and their named constants
DEFINITION = re.compile(r"\s*[A-Z][A-Z_]* = \x22infra")  # a member or a constant, defined


def infra_literals(root: Path) -> list[str]:
    """``path:line: text`` of each string starting with infra in the *.py files under ``root`` (hidden folders
    and build outputs left out: build/ holds copies after a wheel build) that is not a definition in an enum
    module."""
    found = []
    for folder, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if not d.startswith(".") and d not in ("build", "dist"))
        for name in sorted(f for f in files if f.endswith(".py")):
            path = Path(folder) / name
            rel = path.relative_to(root).as_posix()
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if NEEDLE in line and not (rel in ENUM_FILES and DEFINITION.match(line)):
                    found.append(f"{rel}:{n}: {line.strip()}")
    return sorted(found)


def test_statuses_are_spelt_only_in_their_enums(project_root, tmp_path):
    assert infra_literals(project_root) == []
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "trace.py").write_text(f'    INFRA_ERROR = {NEEDLE}_error"\nok = s != {NEEDLE}_error"\n')
    (tmp_path / "queue.py").write_text(f'INFRA_ERROR = {NEEDLE}_error"\n')
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "lib.py").write_text(f'x = {NEEDLE}"\n')
    assert infra_literals(tmp_path) == [f'harness/trace.py:2: ok = s != {NEEDLE}_error"',
                                        f'queue.py:1: INFRA_ERROR = {NEEDLE}_error"']


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
    import sao_harness.harness.store as store_mod

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
        import sao_harness.harness.store as s
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
    run = lambda *a: subprocess.run([sys.executable, "-m", "sao_harness.sao.cli", "trace", "show", *a],
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
