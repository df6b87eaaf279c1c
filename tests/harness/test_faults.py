"""Faults injected during a real `sao rollout` and `sao train` (issue 37): each row of bench/bench_faults.py.

Every test runs one fault in one command with real sandboxes (bundled tasks, compact profile, the expert
engine) and holds the row to its checks: the episodes hit end ``infra_error`` with no reward or are retried,
no trace written before the fault is lost or half-written, and the run goes on or stops with a clear
message and resumes to the fault-free result (every task resolved).
"""
from __future__ import annotations

import importlib.util
import sys

import pytest

from sao_harness.envs.config import DockerConfig
from sao_harness.envs.engine import ProjectEngine

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def bench(project_root):
    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(project_root / "bench"))  # as `python bench/bench_faults.py` has it (_common)
    spec = importlib.util.spec_from_file_location("bench_faults", project_root / "bench/bench_faults.py")
    module = importlib.util.module_from_spec(spec)
    mp.setitem(sys.modules, "bench_faults", module)  # its dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    yield module
    mp.undo()


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray for the module's `sao train` runs (train() keeps a session it did not start)."""
    import ray

    from sao_harness.trainer.run.ray_utils import start_ray

    started = start_ray(None, log=lambda m: None)
    yield
    if started:
        ray.shutdown()


def _run(bench, fault, mode, request):
    if mode == "train":
        request.getfixturevalue("ray_session")
    out = bench.run_fault(fault, mode)
    print(bench.table([out]))
    assert not out.problems, "\n".join(out.problems + out.log[-60:])
    assert out.lost == 0 and out.recovered, out.row()
    assert out.affected >= 1
    return out


@pytest.mark.exclusive  # every sandbox of the machine dies with the engine: make test runs it alone
@pytest.mark.parametrize("mode", ["rollout", "train"])
def test_engine_restart(bench, docker_engine, mode, request):
    if ProjectEngine(DockerConfig().state_dir).pid() is None:
        pytest.skip("the engine in use is not the project engine: this test does not restart it")
    out = _run(bench, "engine_restart", mode, request)
    assert out.infra + out.retried >= 1  # the episodes in flight: infra errors, retried


@pytest.mark.parametrize("mode", ["rollout", "train"])
def test_oom_kill(bench, docker_engine, mode, request):
    out = _run(bench, "oom_kill", mode, request)
    assert out.retried >= 1  # the OOM-killed sandbox's episode ran again


@pytest.mark.parametrize("mode", ["rollout", "train"])
def test_disk_full(bench, docker_engine, mode, request):
    out = _run(bench, "disk_full", mode, request)
    assert "stopped" in out.how and "No space left on device" in out.how and "resumed" in out.how


@pytest.mark.parametrize("mode", ["rollout", "train"])
def test_worker_kill(bench, docker_engine, mode, request):
    out = _run(bench, "worker_kill", mode, request)
    if mode == "train":
        assert "worker_deaths=1" in out.how and out.retried >= 1
    else:
        assert "killed (exit -9)" in out.how


@pytest.mark.parametrize("mode", ["rollout", "train"])
def test_engine_kill(bench, docker_engine, mode, request):
    out = _run(bench, "engine_kill", mode, request)
    assert out.infra >= 1
    if mode == "train":
        assert "engine_deaths=1" in out.how


@pytest.mark.parametrize("mode", ["rollout", "train"])
def test_hang(bench, docker_engine, mode, request):
    _run(bench, "hang", mode, request)
