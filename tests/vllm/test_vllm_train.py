"""``sao train engine.kind=vllm trainer.env=toy`` on the Qwen3-MoE test model: the trainer in the main venv
(no vLLM there), the engine replica a Ray actor running ``.venv-vllm``'s Python (``runtime_env``
``py_executable``, ``harness.engines.vllm_env``), weights published over the gloo collective into vLLM.
Midway the engine core is killed: the replica is replaced, the episodes it failed are infra errors, and both
are counted."""
from __future__ import annotations

import json
import subprocess
import time

import psutil
import yaml

from tests.support.vllm_testmodel import ensure_test_model
from tests.vllm.conftest import CACHE, REPO

STEPS = 4
KILL_AT_STEP = 1


def config(tmp_path) -> dict:
    base = yaml.safe_load((REPO / "configs/learn-toy.yaml").read_text())
    base["run"].update(name="vllm-toy", root=str(tmp_path))
    base["model"] = {"path": str(ensure_test_model(CACHE, "moe")), "cache_dir": str(CACHE), "dtype": "float32"}
    base["engine"] = {"kind": "vllm", "gpus_per_replica": 0, "max_model_len": 1024, "kv_cache_bytes": 2**30,
                      "timeout_s": 120, "vllm_args": {"enforce_eager": True, "max_num_seqs": 8}}
    # max_infra_frac off: with one replica and 1-token episodes, every episode tried while the killed replica is
    # replaced (~60 s on CPU) fails at once (18 of 34 here), far over the 0.2 share that stops a run
    # (tests/trainer/test_infra_frac.py tests that stop); this test is about the run surviving the death
    base["rollout"] = {"workers": 2, "max_retries": 1, "max_infra_frac": None}
    base["trainer"].update(max_steps=STEPS, batch_size=8, save_every=1000, critic_steps=1)
    base["runtime"].update(batch_timeout_s=400, weight_sync="collective", publish_timeout_s=300, actor_timeout_s=300)
    return base


def engine_cores(root: psutil.Process) -> list[psutil.Process]:
    out = []
    for p in root.children(recursive=True):
        try:
            if "EngineCore" in p.name() or any("EngineCore" in a for a in p.cmdline()):
                out.append(p)
        except psutil.Error:
            pass
    return out


def test_sao_train_with_the_vllm_engine_publishes_weights_and_survives_an_engine_death(tmp_path):
    cfg_file = tmp_path / "vllm-toy.yaml"
    cfg_file.write_text(yaml.safe_dump(config(tmp_path)))
    sao = REPO / ".venv" / "bin" / "sao"
    log_file = tmp_path / "train.log"
    with open(log_file, "w") as out:
        proc = subprocess.Popen([str(sao), "train", "--config", str(cfg_file)], cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT)
    killed = None
    try:
        metrics = tmp_path / "vllm-toy" / "metrics.jsonl"
        deadline = time.monotonic() + 480
        while proc.poll() is None and time.monotonic() < deadline:
            if killed is None and _steps(metrics) >= KILL_AT_STEP:
                cores = engine_cores(psutil.Process(proc.pid))
                if cores:
                    killed = cores[0].pid
                    cores[0].kill()
            time.sleep(0.5)
        rc = proc.wait(timeout=max(1, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
    log = log_file.read_text(errors="replace")
    tail = "\n".join(log.splitlines()[-40:])
    assert rc == 0, f"sao train exited {rc}:\n{tail}"
    assert killed is not None, f"no vLLM engine core found under sao train to kill:\n{tail}"
    assert f"sao train: done, step {STEPS}, policy version {STEPS}" in log, tail
    assert "weight sync: gloo group" in log, tail
    assert "engine replica r0 died" in log and "engine replica r0.1 serving policy version" in log, tail
    steps = [json.loads(line) for line in (tmp_path / "vllm-toy" / "metrics.jsonl").read_text().splitlines()]
    assert [int(m["step"]) for m in steps if "step" in m][-1] == STEPS
    last = steps[-1]
    assert last["rollout/engine_version"] >= STEPS - 1  # the replicas served the published weights
    assert last["rollout/infra_errors_total"] >= 1, "the episodes on the dead engine are infra errors, counted"


def _steps(metrics) -> int:
    try:
        lines = metrics.read_text().splitlines()
    except OSError:
        return 0
    return sum(1 for line in lines if line.strip())

