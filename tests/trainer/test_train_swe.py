"""`sao train` with `trainer.env=swe`: OpenHands episodes in Docker on bundled tasks, one SAO step.

The same command as `make train` (configs/local.yaml), cut to one step of two trajectories.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from sao_harness.harness.store import TraceStore
from sao_harness.harness.trace import Status
from sao_harness.trainer.dist.checkpoint import latest_checkpoint, read_state
from sao_harness.trainer.report.metrics import read_metrics

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_swe_smoke_one_step_on_bundled_tasks(project_root, tmp_path):
    from sao_harness.envs.engine import ensure_engine
    from sao_harness.envs.gc import list_runs

    client = ensure_engine()
    cmd = [sys.executable, "-m", "sao_harness.sao.cli", "train", "--config", str(project_root / "configs/local.yaml"),
           f"run.root={tmp_path}", "run.name=swe", f"model.cache_dir={project_root / '.cache/sao'}",
           "trainer.max_steps=1", "trainer.batch_size=2", "agent.max_iterations=3", "sampling.max_tokens=64",
           "rollout.workers=2"]
    result = subprocess.run(cmd, cwd=project_root, capture_output=True, text=True, timeout=800)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "step 1 | policy/version 1 |" in result.stdout

    run_dir = tmp_path / "swe"
    ckpt = latest_checkpoint(run_dir)
    assert ckpt is not None and ckpt.name == "step-000001"
    assert (ckpt / "policy" / "model.safetensors").is_file() and (ckpt / "critic" / "critic.safetensors").is_file()
    state = read_state(ckpt)
    assert state["policy_version"] == 1 and state["counters"]["trained"] == 2
    assert read_metrics(run_dir)[-1]["rollout/engine_version"] == 1

    trajs = {t.traj_id: t for t in TraceStore(run_dir)}
    consumed = [trajs[i] for i in state["consumed"]]
    trained = [t for t in consumed if t.reward is not None]
    assert len(trained) == 2
    for t in trained:  # real episodes: the agent in a sandbox, graded by swebench
        assert t.metadata["agent"]["iterations"] >= 1 and t.grading is not None and t.versions == [0]
    assert all(t.reward is None for t in consumed if t.status == Status.INFRA_ERROR)
    run_ids = {t.metadata["run_id"] for t in trajs.values()}
    assert not any(list_runs(client, rid) for rid in run_ids), "the run's sandboxes were not removed"
