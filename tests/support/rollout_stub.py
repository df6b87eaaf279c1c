"""`run_rollout` with no task loading, pre-flight, images or sandbox scope: only `episode` runs."""
from __future__ import annotations

import contextlib

from sao_harness.harness import rollout


def stub_rollout(monkeypatch, tasks, episode) -> None:
    """Make `run_rollout` run `episode(task, ctx, eid)` over `tasks` and nothing else."""
    monkeypatch.setattr(rollout, "tasks_from_config", lambda cfg: (tasks, []))
    monkeypatch.setattr(rollout, "preflight", lambda cfg, tasks, errors, log: tasks)
    monkeypatch.setattr(rollout, "prepare_images", lambda cfg, tasks, log: None)
    monkeypatch.setattr(rollout, "episode_function", lambda env: episode)
    monkeypatch.setattr(rollout, "run_scope", lambda run_id: contextlib.nullcontext())
