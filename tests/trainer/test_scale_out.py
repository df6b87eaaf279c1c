"""Scale-out of `sao train`: engine replicas, workers on other nodes, weights to every replica.

- the bucketed broadcast (trainer.weight_sync) in a real gloo group, without Ray;
- 2 hf replicas, each transport (object store, gloo collective): identical weights on every replica,
  traces from both, each recording its replica;
- a replica killed mid-run: reported, replaced, the run goes on;
- a local multi-node Ray cluster (several raylets on 127.0.0.1): 2 replicas on one node, the rollout
  workers on another (custom resources), a short `sao train` on the learning test-bed.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest
import torch

from sao_harness.harness.engines.vllm_weights import pack, plan
from sao_harness.harness.store import TraceStore
from sao_harness.harness.trace import Status
from sao_harness.sao.config import load_config
from sao_harness.trainer.report.metrics import read_metrics
from sao_harness.trainer.run import weight_sync

pytestmark = pytest.mark.slow  # Ray clusters with engine replicas: 15-60 s each


def sim_cfg(tmp_path, name, project_root, *extra):
    return load_config(project_root / "configs/local.yaml", [
        f"run.root={tmp_path}", f"run.name={name}", f"model.cache_dir={project_root / '.cache/sao'}",
        "trainer.env=simulated", "sampling.max_tokens=8", "testbed.simulated.turns_median=3",
        "testbed.simulated.env_sleep_s=0.05",
        "runtime.poll_interval_s=0.05", "runtime.batch_timeout_s=120", "runtime.actor_timeout_s=120",
        "runtime.publish_timeout_s=60", "trainer.critic_steps=1", "trainer.critic_warmup_steps=0", "trainer.lr=1e-3",
        "trainer.critic_lr=1e-4", "rollout.max_retries=0", "trainer.save_every=100", "engine.replicas=2", *extra])


def test_bucketed_broadcast_delivers_identical_tensors():
    """Mixed dtypes over several buckets, trainer rank 0 -> 2 receivers in a gloo group (threads)."""
    weights = {"a": torch.randn(7, 5), "b": torch.randn(33).to(torch.bfloat16), "c": torch.arange(9),
               "d": torch.rand(4, 4) > 0.5, "e": torch.randn(300, 3).to(torch.float16)}
    buckets = plan(weights, bucket_bytes=160)
    assert len(buckets) >= 3 and [i[0] for b in buckets for i in b["items"]] == list(weights)
    port, got = weight_sync.free_port("127.0.0.1"), {}

    def rank(r):
        group, _store = weight_sync.make_group("gloo", "127.0.0.1", port, r, 3, 30, "127.0.0.1")
        if r == 0:
            for b in buckets:
                weight_sync.broadcast(group, pack(weights, b, "cpu"))
        else:
            got[r] = weight_sync.receive(group, buckets, "cpu")

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    for r in (1, 2):
        assert list(got[r]) == list(weights)
        for k, v in weights.items():
            assert got[r][k].dtype == v.dtype and torch.equal(got[r][k], v), (r, k)


def _digest(weights: dict) -> dict[str, float]:
    return {k: float(v.double().sum()) for k, v in weights.items()}


@pytest.fixture(scope="module")
def ray_session():
    import ray

    from sao_harness.trainer.run.ray_utils import start_ray

    start_ray(None, log=lambda m: None)
    yield
    ray.shutdown()


@pytest.mark.parametrize("transport", ["object_store", "collective"])
def test_two_replicas_get_identical_weights(ray_session, project_root, tmp_path, transport):
    """Every publish lands the trainer's weights, identical, on both replicas; episodes go to both, and
    every trace records its replica."""
    import ray

    from sao_harness.trainer.modeling.precision import engine_weights
    from sao_harness.trainer.run.loop import train

    cfg = sim_cfg(tmp_path, transport, project_root, f"runtime.weight_sync={transport}", "trainer.max_steps=3",
                  "trainer.batch_size=4", "rollout.workers=4")
    checked, lines = [], []

    def update(trainer, trajectories):
        if trainer.policy_version:  # the last publish is in force: both replicas serve the trainer's weights
            session = trajectories[0].metadata["assignment"].split(":")[0]
            want = _digest(engine_weights(trainer.policy, cfg.model.dtype))
            got = ray.get([ray.get_actor(f"sao-engine-{session}-r{i}").weights_digest.remote() for i in (0, 1)])
            assert got[0] == got[1] == want
            checked.append(trainer.policy_version)
        return trainer.update(trajectories)

    train(cfg, update_fn=update, log=lines.append)
    assert checked == [1, 2]
    assert any(f"weight sync {transport}" in line for line in lines)
    trajs = list(TraceStore(cfg.run.dir))
    by_replica = Counter(t.metadata["replica"] for t in trajs)
    assert set(by_replica) == {"r0", "r1"}, by_replica
    assert [r["rollout/engine_version"] for r in read_metrics(cfg.run.dir)] == [1, 2, 3]


def test_a_dead_replica_is_reported_and_replaced(ray_session, project_root, tmp_path):
    """A replica killed between publishes: reported, withdrawn, replaced at the current version; the run
    ends normally; the only infra errors are episodes that were on the dead replica."""
    import ray

    from sao_harness.trainer.run.loop import train

    cfg = sim_cfg(tmp_path, "dead-replica", project_root, "trainer.max_steps=4", "trainer.batch_size=4",
                  "rollout.workers=4", "testbed.simulated.engine_s=0.05")
    lines = []

    def update(trainer, trajectories):
        if trainer.policy_version == 1:
            session = trajectories[0].metadata["assignment"].split(":")[0]
            victim = ray.get_actor(f"sao-engine-{session}-r1")
            ray.kill(victim)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # dead for sure before the publish looks
                try:
                    ray.get(victim.stats.remote(), timeout=5)
                except Exception:  # noqa: BLE001
                    break
            time.sleep(0.5)
        return trainer.update(trajectories)

    summary = train(cfg, update_fn=update, log=lines.append)
    assert summary["steps"] == 4 and summary["counters"]["engine_deaths"] == 1
    assert any(line.startswith("engine replica r1 died") for line in lines)
    assert any(line.startswith("engine replica r1.1 serving policy version 2") for line in lines)
    trajs = list(TraceStore(cfg.run.dir))
    assert {t.metadata["replica"] for t in trajs if t.status == Status.INFRA_ERROR} <= {"r1"}
    assert [r["rollout/engine_version"] for r in read_metrics(cfg.run.dir)] == [1, 2, 3, 4]


def test_a_replica_that_dies_during_a_publish_is_replaced_and_the_publish_redone(ray_session, project_root,
                                                                                 tmp_path, monkeypatch):
    """The replica dies after the publish's own check and before its weights land (the race `make test-vllm`
    hit): the run is not ended; the replica is replaced and version 2 published again, to every replica."""
    import ray

    from sao_harness.trainer.run.loop import train

    cfg = sim_cfg(tmp_path, "dies-in-publish", project_root, "trainer.max_steps=3", "trainer.batch_size=4",
                  "rollout.workers=4", "testbed.simulated.engine_s=0.05", "runtime.weight_sync=object_store")
    honest, killed, lines = weight_sync.ObjectStoreSync.publish, [], []

    def publish(self, replicas, version, weights, timeout_s):
        if version == 2 and not killed:
            victim = replicas["r1"]
            ray.kill(victim)
            killed.append(version)
        return honest(self, replicas, version, weights, timeout_s)

    monkeypatch.setattr(weight_sync.ObjectStoreSync, "publish", publish)
    summary = train(cfg, log=lines.append)
    assert killed == [2]
    assert summary["steps"] == 3 and summary["counters"]["engine_deaths"] == 1, lines
    assert any("publishing weights version 2" in line and "publishing again" in line for line in lines), lines
    assert any(line.startswith("engine replica r1.1 serving policy version 2") for line in lines), lines
    assert [r["rollout/engine_version"] for r in read_metrics(cfg.run.dir)] == [1, 2, 3]


def test_a_replica_whose_weight_call_raises_is_a_loop_error_naming_it(ray_session):
    """A replica that is alive but whose update call raised (vLLM: its engine core died, EngineError) is a
    LoopError naming the replica, as a dead actor is: what `EngineReplicas.publish` replaces and redoes (a raw
    RayTaskError escaped it, and a vLLM core killed during a broadcast ended the run)."""
    import ray

    from sao_harness.trainer.run.ray_utils import LoopError

    @ray.remote(num_cpus=0)
    class Replica:
        def update_weights(self, version, weights, timeout):
            raise ValueError("engine core died")

    replica = Replica.remote()
    with pytest.raises(LoopError, match=r"publishing weights version 3 to engine replica r0: ValueError: engine core"):
        weight_sync._wait_all({"r0": replica.update_weights.remote(3, {}, 5)}, 3, 5)
    ray.kill(replica)


@pytest.mark.slow
def test_local_multi_node_cluster(project_root, tmp_path, monkeypatch):
    """Three raylets on 127.0.0.1: a head (the trainer), an `engine` node with 2 replicas, a `docker`
    node with the rollout workers; `sao train` on the toy test-bed, with the gloo collective. Sync rounds
    of 4 episodes on 4 workers: the least-loaded routing puts 2 on each replica and the round waits for all
    of them (in async mode a slow replica's episodes may still be in flight when the run ends)."""
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # every Ray server binds 127.0.0.1
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
    common = {"node_ip_address": "127.0.0.1", "include_dashboard": False, "num_cpus": 1}
    cluster = Cluster(initialize_head=True, head_node_args={**common, "resources": {"trainer": 1}})
    try:
        cluster.add_node(**common, resources={"engine": 2})
        cluster.add_node(**common, resources={"docker": 4})
        cmd = [sys.executable, "-m", "sao_harness.sao.cli",
               "train", "--config", str(project_root / "configs/learn-toy.yaml"),
               f"run.root={tmp_path}", "run.name=cluster", f"model.cache_dir={project_root / '.cache/sao'}",
               f"runtime.ray_address={cluster.address}", "trainer.max_steps=2", "trainer.batch_size=4",
               "trainer.mode=sync", "trainer.group_size=2", "rollout.workers=4", "engine.replicas=2",
               "engine.node_resources={engine: 1}",
               "rollout.node_resources={docker: 1}", "runtime.weight_sync=collective", "trainer.critic_steps=1",
               "runtime.batch_timeout_s=90", "runtime.actor_timeout_s=90"]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        out = subprocess.run(cmd, cwd=project_root, capture_output=True, text=True, timeout=240, env=env)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        assert "sao train: done, step 2" in out.stdout
    finally:
        cluster.shutdown()
    trajs = list(TraceStore(tmp_path / "cluster"))
    assert {t.metadata["replica"] for t in trajs} == {"r0", "r1"}
