"""Data-parallel SAO on FSDP2 (trainer.dist.distributed): 2 gloo processes on CPU give the update of one
process on the whole batch.

Reference: SAOTrainer.update on the global batch in this process. Each rank gets a token-balanced part
and other micro-batch counts (max_tokens_per_microbatch=96), so the balance passes, the global token counts,
the global whitening and FSDP's summed reduce-scatter all have to be right; clipping binds
(max_grad_norm below the gradient norms), so the gradient's scale matters, not only its direction.
Last, `sao train` itself with runtime.world_size=2 (trainer.run.ranks drives the rank actors).
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
import torch

from sao_harness.harness.engines.routes import RouteRecorder
from sao_harness.trainer.algo.losses import whiten_advantages
from sao_harness.trainer.algo.sao import SAOTrainer
from sao_harness.trainer.config import TrainerConfig
from sao_harness.trainer.dist import distributed
from sao_harness.trainer.dist.checkpoint import latest_checkpoint, read_state
from sao_harness.trainer.modeling.models import Critic
from sao_harness.trainer.report.metrics import read_metrics
from tests.support.trainer_data import synthetic_trajectories, tiny_policy, trajectory_with_break

pytestmark = pytest.mark.slow
CONFIG = {"lr": 1e-3, "critic_lr": 1e-3, "critic_warmup_steps": 0, "max_tokens_per_microbatch": 96,
          "max_staleness": 100, "max_grad_norm": 0.05}
UPDATES = 2


def with_routes(trajectories):
    """The trajectories with the routes of the initial policy's own forward (replayed: trainer.router_replay)."""
    policy, out = tiny_policy(), []
    recorder = RouteRecorder(policy)
    for t in trajectories:
        with torch.no_grad():
            policy(input_ids=torch.tensor([t.token_ids]))
        out.append(dataclasses.replace(t, routed_experts=recorder.take()))
    return out


def batches():  # each with a trajectory with a history break: skipped and counted on every rank alike
    return [with_routes(synthetic_trajectories(10, seed=s)) + [trajectory_with_break()] for s in range(UPDATES)]


def build() -> SAOTrainer:
    policy = tiny_policy()
    return SAOTrainer(policy, Critic.from_policy(policy), TrainerConfig(**CONFIG))


def _run(rank, world_size, address, variant, ckpt_dir):
    """One rank of one run: the updates, then (rank 0) the metrics, the gathered weights, a checkpoint."""
    rt = distributed.RankTrainer(rank, world_size, address, lambda dp: build())
    if variant == "mean_of_rank_means":  # the classic mistake: per-rank token means, FSDP's averaging
        from torch.distributed.fsdp import FSDPModule
        rt.dp.sum = lambda x: x
        rt.dp.whiten = whiten_advantages
        for m in [*rt.trainer.policy.modules(), *rt.trainer.critic.modules()]:
            if isinstance(m, FSDPModule):
                m.set_gradient_divide_factor(float(world_size))
    metrics = [rt.update(b) for b in batches()]
    policy, critic = rt.policy_weights(), distributed.full_state_dict(rt.trainer.critic)
    path = rt.save_checkpoint(ckpt_dir, 1, state=rt.counters(), keep=2) if ckpt_dir else None
    rt.close()
    return {"metrics": metrics, "policy": policy, "critic": critic, "path": path}


def _ranks(rank, world_size, address, second_port, ckpt_dir):
    """Both runs in the same two processes (a process start costs seconds): right, then the mistake."""
    right = _run(rank, world_size, address, None, ckpt_dir)
    wrong = _run(rank, world_size, (address[0], second_port), "mean_of_rank_means", None)
    return {"right": right, "wrong": wrong} if rank == 0 else None


def max_relative_error(a: dict, b: dict) -> float:
    """max over tensors of ||a - b|| / ||b||."""
    assert a.keys() == b.keys()
    return max(((a[k].float() - b[k].float()).norm() / b[k].float().norm().clamp_min(1e-12)).item() for k in b)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    ckpt_dir = tmp_path_factory.mktemp("dp")
    out = distributed.spawn(2, _ranks, distributed.free_port(), ckpt_dir)[0]
    ref = build()
    out["ref_metrics"] = [ref.update(b) for b in batches()]
    out["ref"] = ref
    return out


def test_two_gloo_ranks_give_the_single_process_update(runs):
    ref, right = runs["ref"], runs["right"]
    print("relative errors: policy", max_relative_error(right["policy"], ref.policy.state_dict()),
          "critic", max_relative_error(right["critic"], ref.critic.state_dict()),
          "grad norms", [m[k] for m in runs["ref_metrics"] for k in m if k.endswith("grad_norm")])
    assert max_relative_error(right["policy"], ref.policy.state_dict()) < 1e-5
    assert max_relative_error(right["critic"], ref.critic.state_dict()) < 1e-5
    start = build()  # the updates moved the weights well beyond the tolerance
    assert max_relative_error(start.policy.state_dict(), ref.policy.state_dict()) > 1e-3
    assert [m["rollout/break_frac"] for m in right["metrics"]] == [1 / 11] * UPDATES


# rank-local by nature: how this rank grouped its rows, and wall-clock figures
LOCAL = ("perf/micro_batches", "perf/update_tokens_per_s")


def test_every_metric_of_two_ranks_is_the_whole_batchs(runs):
    """Each metric family against one process on the whole batch: counts (summed), token means, stds, extremes
    (ratio min / max, version lag max, |logp diff| max and p99), explained variance, DIS's masked fractions,
    the route agreement (the trajectories carry routes: FSDP2-sharded ranks replay them)."""
    families = set()
    for mine, theirs in zip(runs["right"]["metrics"], runs["ref_metrics"]):
        assert mine.keys() == theirs.keys()
        for key in theirs:
            if key in LOCAL or key.startswith("time/"):
                continue
            families.add(key.rsplit("_", 1)[-1] if key.rsplit("_", 1)[-1] in ("std", "max", "min", "p99") else key)
            assert mine[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-6), key
    assert {"std", "max", "min", "p99", "critic/explained_variance", "policy/dis_masked",
            "rollout/route_agreement"} <= families


def test_power_averaging_per_rank_means_fails(runs):
    ref, wrong = runs["ref"], runs["wrong"]
    print("relative errors of the mistake: policy", max_relative_error(wrong["policy"], ref.policy.state_dict()),
          "critic", max_relative_error(wrong["critic"], ref.critic.state_dict()))
    assert max(max_relative_error(wrong["policy"], ref.policy.state_dict()),
               max_relative_error(wrong["critic"], ref.critic.state_dict())) > 1e-3


def test_the_sharded_checkpoint_resumes_a_single_process_trainer_exactly(runs):
    """The ranks' checkpoint format (trainer/dist/checkpoint.py, sharded: policy/ + dcp/) in one process."""
    from transformers import AutoModelForCausalLM

    from sao_harness.trainer.dist import checkpoint

    ref, path = runs["ref"], runs["right"]["path"]
    assert checkpoint.is_sharded(path)
    policy = AutoModelForCausalLM.from_pretrained(path / "policy", dtype=torch.float32)
    trainer = SAOTrainer(policy, Critic.from_policy(policy), ref.config)
    checkpoint.restore_optimizers(path, trainer)
    trainer.policy_version = checkpoint.read_state(path)["policy_version"]
    assert trainer.policy_version == ref.policy_version == UPDATES
    assert max_relative_error(trainer.policy.state_dict(), ref.policy.state_dict()) < 1e-5
    nxt = synthetic_trajectories(10, seed=7)
    ref.update(nxt)
    trainer.update(nxt)
    assert max_relative_error(trainer.policy.state_dict(), ref.policy.state_dict()) < 1e-5
    assert max_relative_error(trainer.critic.state_dict(), ref.critic.state_dict()) < 1e-5


def test_sao_train_with_two_ranks_checkpoints_what_one_process_resumes(project_root, tiny_model_dir, tmp_path):
    """`sao train` with runtime.world_size=2 (two FSDP2 rank actors on gloo, the simulated env) runs 2
    steps through the CLI; a world_size=1 run resumes from its checkpoint; both log the same metrics.
    Rank start under load: runtime.actor_timeout_s=300."""
    def sao_train(*extra):
        cmd = [sys.executable, "-m", "sao_harness.sao.cli",
               "train", "--config", str(project_root / "configs/local.yaml"),
               f"run.root={tmp_path}", "run.name=dp", f"model.cache_dir={tiny_model_dir.parent}",
               "trainer.env=simulated", "sampling.max_tokens=8", "testbed.simulated.turns_median=2",
               "testbed.simulated.env_sleep_s=0.02", "runtime.poll_interval_s=0.05", "trainer.batch_size=4",
               "trainer.save_every=2", "runtime.actor_timeout_s=300", "runtime.batch_timeout_s=120",
               "runtime.publish_timeout_s=120", "rollout.workers=2", "rollout.max_retries=0", *extra]
        out = subprocess.run(cmd, cwd=project_root, capture_output=True, text=True, timeout=300,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        return out.stdout

    run_dir = tmp_path / "dp"
    first = sao_train("runtime.world_size=2", "trainer.max_steps=2")
    assert "trainer: 2 FSDP2 ranks (gloo, store at 127.0.0.1)" in first
    ckpt = latest_checkpoint(run_dir)
    state = read_state(ckpt)
    assert ckpt.name == "step-000002" and state["step"] == 2 and state["policy_version"] == 2
    assert state["policy_optimizer_steps"] == 2 and state["critic_optimizer_steps"] == 4  # critic_steps=2

    second = sao_train("runtime.world_size=1", "trainer.max_steps=3")
    assert f"resuming {run_dir} from step-000002" in second
    final = read_state(latest_checkpoint(run_dir))
    assert final["step"] == 3 and final["policy_version"] == 3 and final["critic_optimizer_steps"] == 6
    records = {r["step"]: r for r in read_metrics(run_dir)}
    assert sorted(records) == [1, 2, 3]
    assert records[2].keys() == records[3].keys()  # world_size 2 and 1, both checkpoint steps
    for key in ("loss/value_loss", "loss/policy_loss", "critic/explained_variance", "policy/grad_norm",
                "rollout/reward_mean", "perf/engine_idle_frac", "time/update_s", "time/publish_s"):
        assert key in records[2], key
    assert records[2]["rollout/trajectories"] == 4 and records[2]["policy/version"] == 2
