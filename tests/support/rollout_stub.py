"""`run_rollout` with no images or sandbox scope: only `episode` runs (over the tasks it is given)."""
from __future__ import annotations

import contextlib

from sao_harness.harness import rollout


def stub_rollout(monkeypatch, episode) -> None:
    """Make `run_rollout(cfg, tasks)` run `episode(task, ctx, eid)` over `tasks` and nothing else."""
    monkeypatch.setattr(rollout, "prepare_images", lambda cfg, tasks, log: None)
    monkeypatch.setattr(rollout, "episode_function", lambda env: episode)
    monkeypatch.setattr(rollout, "run_scope", lambda run_id: contextlib.nullcontext())
