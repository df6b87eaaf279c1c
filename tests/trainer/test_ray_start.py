"""`start_ray` on a node too busy for Ray's fixed 30 s raylet registration: the start is tried once more; any
other failure of `ray.init` is raised as it is."""
from __future__ import annotations

import types

import pytest
import ray

from sao_harness.trainer.run import ray_utils

TIMED_OUT = Exception("The current node timed out during startup. This could happen because some of the raylet "
                      "failed to startup or the GCS has become overloaded.")


def _fake_ray(monkeypatch, failures: list[Exception]) -> list[str]:
    calls = []

    def init(**kwargs):
        calls.append("init")
        if failures:
            raise failures.pop(0)

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: calls.append("shutdown"))
    monkeypatch.setattr(ray, "get_runtime_context", lambda: types.SimpleNamespace(gcs_address="127.0.0.1:1"))
    return calls


def test_a_raylet_that_did_not_register_in_time_is_started_again(monkeypatch):
    calls, logs = _fake_ray(monkeypatch, [TIMED_OUT]), []
    assert ray_utils.start_ray(None, log=logs.append) is True
    assert calls == ["init", "shutdown", "init"]
    assert any("starting again (2/2)" in line for line in logs), logs


def test_a_second_timeout_and_any_other_failure_are_raised(monkeypatch):
    _fake_ray(monkeypatch, [TIMED_OUT, TIMED_OUT])
    with pytest.raises(Exception, match="timed out during startup"):
        ray_utils.start_ray(None, log=lambda m: None)
    calls = _fake_ray(monkeypatch, [ValueError("bad argument")])
    with pytest.raises(ValueError, match="bad argument"):
        ray_utils.start_ray(None, log=lambda m: None)
    assert calls == ["init"]
