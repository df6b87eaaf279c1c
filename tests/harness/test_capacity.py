"""harness.capacity: a process sized for rollout.workers episodes at once (open files, Docker pools). No Docker."""
from __future__ import annotations

import resource

import pytest

from sao_harness.envs import engine
from sao_harness.harness import capacity


@pytest.fixture
def rlimit(monkeypatch):
    """A fake RLIMIT_NOFILE: ``state["limit"]`` is (soft, hard); setrlimit calls are recorded."""
    state = {"limit": (1024, 4096), "set": []}

    def setrlimit(which, limit):
        assert which == resource.RLIMIT_NOFILE
        state["set"].append(limit)
        state["limit"] = limit

    monkeypatch.setattr(capacity.resource, "getrlimit", lambda which: state["limit"])
    monkeypatch.setattr(capacity.resource, "setrlimit", setrlimit)
    return state


@pytest.fixture
def pool(monkeypatch):
    monkeypatch.setattr(engine, "_pool_size", engine.MAX_POOL)


def test_a_low_soft_limit_is_raised_to_the_hard_one(rlimit):
    assert capacity.raise_open_files(64, log=lambda *_: None) == 4096
    assert rlimit["set"] == [(4096, 4096)]


def test_a_soft_limit_that_suffices_is_left_alone(rlimit):
    rlimit["limit"] = (capacity.fds_needed(16), 8192)
    assert capacity.raise_open_files(16) == capacity.fds_needed(16)
    assert rlimit["set"] == []


def test_a_hard_limit_too_low_is_said(rlimit):
    said = []
    assert capacity.raise_open_files(128, log=said.append) == 4096
    assert "may open at most 4096" in said[0] and "rollout.workers" in said[0]


def test_docker_clients_pool_at_least_one_connection_per_rollout_worker(monkeypatch, rlimit, pool):
    made = []

    class FakeClient:
        def __init__(self, **kwargs):
            made.append(kwargs)

    import docker

    monkeypatch.setattr(docker, "DockerClient", FakeClient)
    assert engine._client("unix:///nowhere").sao_pool_size == engine.MAX_POOL
    capacity.size_process(128, log=lambda *_: None)
    client = engine._client("unix:///nowhere")
    assert made[-1]["max_pool_size"] >= 128 and client.sao_pool_size == made[-1]["max_pool_size"]
    capacity.size_process(4, log=lambda *_: None)  # a smaller run later never shrinks it
    assert engine.pool_size() == made[-1]["max_pool_size"]


def test_the_graders_client_is_made_anew_when_the_pool_grew(monkeypatch, pool):
    from sao_harness.tasks.grading import grade

    class Client:
        def __init__(self):
            self.sao_pool_size = engine.pool_size()

    monkeypatch.setattr(grade, "_client", None)
    monkeypatch.setattr(grade, "ensure_engine", lambda cfg: Client())
    first = grade.default_client()
    assert grade.default_client() is first
    engine.ensure_pool(512)
    assert grade.default_client() is not first and grade.default_client().sao_pool_size == 512
