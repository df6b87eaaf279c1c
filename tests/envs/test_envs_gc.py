"""Leftovers: gc removes only dead runs' containers/volumes; runs clean up after themselves."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]


def _dead_pid_labels(run_id: str) -> dict:
    from sao_harness.envs.labels import PID_KEY, PID_START_KEY, process_start_time, run_labels

    p = subprocess.Popen(["sleep", "0.3"])
    start = process_start_time(p.pid)
    p.wait()
    return {**run_labels(run_id), PID_KEY: str(p.pid), PID_START_KEY: start}


def _container(client, image, labels):
    return client.containers.create(image, entrypoint=["sleep"], command=["infinity"], labels=labels,
                                    network_mode="none", init=True, name=f"sao-gc-test-{uuid.uuid4().hex[:8]}")


def _ours(client, run_id):
    from sao_harness.envs.labels import owner_filter

    return client.containers.list(all=True, filters=owner_filter(run_id))


def test_gc_removes_only_dead_runs(docker_engine, base_image):
    from sao_harness.envs.gc import gc
    from sao_harness.envs.labels import run_labels

    client = docker_engine
    dead, alive = f"gc-dead-{uuid.uuid4().hex[:6]}", f"gc-alive-{uuid.uuid4().hex[:6]}"
    dead_labels = _dead_pid_labels(dead)
    c_dead = _container(client, base_image, dead_labels)
    v_dead = client.volumes.create(name=f"sao-gc-test-{uuid.uuid4().hex[:8]}", labels=dead_labels)
    c_alive = _container(client, base_image, run_labels(alive))
    # not ours: same run-id label but no owner label; and an owner label with a foreign value
    foreign = _container(client, base_image, {"sao-harness.run-id": dead, "sao-harness.pid": "1"})
    foreign2 = _container(client, base_image, {**dead_labels, "sao-harness.owner": "someone-else"})
    other_host = _container(client, base_image, {**dead_labels, "sao-harness.run-id": dead + "-x",
                                                 "sao-harness.host": "another-machine"})
    try:
        rows = {info.run_id: action for info, action in gc(client, dry_run=True)}
        assert rows[dead].startswith("would remove 1 container(s), 1 volume(s)")
        assert rows[alive].startswith("kept: alive") and rows[dead + "-x"].startswith("kept: owner unknown")
        assert _ours(client, dead)
        rows = {info.run_id: action for info, action in gc(client)}
        assert rows[dead] == "removed 1 container(s), 1 volume(s)"
        names = {c.name for c in client.containers.list(all=True)}
        assert c_dead.name not in names
        assert {c_alive.name, foreign.name, foreign2.name, other_host.name} <= names
        assert v_dead.name not in {v.name for v in client.volumes.list()}
    finally:
        for obj in (c_dead, c_alive, foreign, foreign2, other_host, v_dead):
            try:
                obj.remove(force=True)
            except Exception:
                pass


def test_cleanup_run_and_run_scope(docker_engine, base_image):
    from sao_harness.envs.config import SandboxConfig
    from sao_harness.envs.gc import cleanup_run, run_scope
    from sao_harness.envs.sandbox import Sandbox

    rid = f"gc-scope-{uuid.uuid4().hex[:6]}"
    with pytest.raises(KeyboardInterrupt):
        with run_scope(rid, docker_engine):
            sb = Sandbox(base_image, SandboxConfig(memory="128m"), client=docker_engine, run_id=rid)
            assert len(_ours(docker_engine, rid)) == 1
            raise KeyboardInterrupt  # as Ctrl-C would, before the sandbox is closed
    assert _ours(docker_engine, rid) == []
    sb.close()  # already gone: quiet
    assert cleanup_run(rid, docker_engine) == (0, 0)


_CHILD = textwrap.dedent("""
    import signal, sys, time
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C as in a terminal, whatever was inherited
    from sao_harness.envs.engine import docker_client
    from sao_harness.envs.gc import run_scope
    from sao_harness.envs.sandbox import Sandbox
    from sao_harness.envs.config import SandboxConfig
    with run_scope(sys.argv[1]):
        sb = Sandbox(sys.argv[2], SandboxConfig(memory="128m"), run_id=sys.argv[1])
        print("ready", flush=True)
        time.sleep(120)
""")


def _child(rid: str, image: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", _CHILD, rid, image], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.stdout.readline().strip() == "ready"
    return p


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_run_cleans_up_on_signals(docker_engine, base_image, sig):
    rid = f"gc-sig-{uuid.uuid4().hex[:6]}"
    p = _child(rid, base_image)
    assert len(_ours(docker_engine, rid)) == 1
    p.send_signal(sig)
    p.wait(timeout=30)
    assert _ours(docker_engine, rid) == []


def test_a_crashed_run_is_collected_by_the_cli(docker_engine, base_image, capsys):
    from sao_harness.sao.cli import main

    rid = f"gc-crash-{uuid.uuid4().hex[:6]}"
    p = _child(rid, base_image)
    assert main(["sandbox", "gc", "--run-id", rid]) == 0  # alive: kept
    assert "kept: alive" in capsys.readouterr().out and len(_ours(docker_engine, rid)) == 1
    p.kill()  # SIGKILL: no cleanup runs
    p.wait(timeout=30)
    time.sleep(0.1)
    assert len(_ours(docker_engine, rid)) == 1
    assert main(["sandbox", "gc", "--run-id", rid]) == 0
    assert "removed 1 container(s)" in capsys.readouterr().out
    assert _ours(docker_engine, rid) == []
