"""`sao sandbox exec|shell|gc` and `sao docker ...` as a user runs them (subprocesses of .venv/bin/sao)."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]


RUN_ID = f"pytest-cli-{uuid.uuid4().hex[:8]}"


def sao(*args: str, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sao_harness.sao.cli",
                           *args], cwd=ROOT, input=stdin, capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "SAO_RUN_ID": RUN_ID})


def _ours(client):
    """Containers of the runs these tests start (others may run sandboxes on the same engine)."""
    from sao_harness.envs.labels import owner_filter

    return {c.id for c in client.containers.list(all=True, filters=owner_filter(RUN_ID))}


def test_exec_prints_output_and_returns_the_exit_code(docker_engine, base_image):
    r = sao("sandbox", "exec", "--image", base_image, "--", "sh", "-c", "echo out; echo err >&2; exit 5")
    assert r.returncode == 5 and r.stdout == "out\nerr\n" and "[exit code 5]" in r.stderr
    r = sao("sandbox", "exec", "--", "cat /etc/debian_version && ls /sys/class/net")  # default image
    assert r.returncode == 0 and r.stdout.endswith("\nlo\n"), r.stderr
    assert _ours(docker_engine) == set()  # its sandbox is gone


def test_exec_timeout_and_config_overrides(docker_engine, base_image):
    r = sao("sandbox", "exec", "--timeout", "1", "--", "echo begun; sleep 30")
    assert r.returncode == 124 and r.stdout.startswith("begun") and "timed out after 1 s" in r.stderr
    r = sao("sandbox", "exec", "--set", "sandbox.memory=64m", "--", "python3 -c 'bytearray(300 * 2**20)'")
    assert r.returncode == 137 and "memory limit (64m)" in r.stderr
    r = sao("sandbox", "exec", "--set", "sandbox.pids_limit=0", "--", "true")
    assert r.returncode == 2 and "pids_limit" in r.stderr


def test_exec_bad_input_is_one_line(docker_engine):
    r = sao("sandbox", "exec", "--image", "sao-harness/missing:nope", "--", "true")
    assert r.returncode == 2 and "sao-harness/missing:nope" in r.stderr and "Traceback" not in r.stderr
    r = sao("sandbox", "exec")
    assert r.returncode == 2 and "no command given" in r.stderr
    r = sao("sandbox", "exec", "--timeout", "-1", "--", "true")
    assert r.returncode == 2 and "--timeout" in r.stderr


def test_shell_runs_in_a_hardened_sandbox_and_removes_it(docker_engine, base_image):
    r = sao("sandbox", "shell", "--image", base_image,
            stdin="echo in-$(hostname); grep CapEff /proc/self/status; ls /sys/class/net; exit 3\n")
    assert r.returncode == 3, r.stderr
    assert r.stdout == "in-sandbox\nCapEff:\t0000000000000000\nlo\n"
    assert _ours(docker_engine) == set()


def test_docker_status_and_gc_dry_run(docker_engine):
    r = sao("docker", "status")
    assert r.returncode == 0 and "networks:" in r.stdout
    r = sao("sandbox", "gc", "--all-dead", "--dry-run")
    assert r.returncode == 0 and r.stdout.startswith("gc: ")
