"""The hard disk cap: the project engine's own btrfs data root, and the cap every container gets on it."""
from __future__ import annotations

import subprocess

import pytest

from sao_harness.envs.config import DockerConfig, SandboxConfig, size_bytes


class FakeClient:
    def __init__(self, driver):
        self.driver = driver

    def info(self):
        return {"Driver": self.driver}


def test_hard_cap_is_the_budget_on_btrfs_and_absent_elsewhere():
    from sao_harness.envs.limits import hard_disk_cap

    budget = 128 << 20
    assert hard_disk_cap(FakeClient("btrfs"), budget) == {"storage_opt": {"size": str(budget)}}
    assert hard_disk_cap(FakeClient("overlay2"), budget) == {}  # ext4: no size option at all


def test_grading_containers_get_the_cap_from_the_sandbox_budget():
    from sao_harness.tasks.grading.grade_sandbox import GradeLimits, hardened_kwargs

    limits = GradeLimits.from_config(SandboxConfig(disk_bytes="1g"))
    assert limits.disk_bytes == 1 << 30
    kw = hardened_kwargs(limits, FakeClient("btrfs"))
    assert kw["storage_opt"] == {"size": str(1 << 30)} and kw["network_mode"] == "none"
    assert "storage_opt" not in hardened_kwargs(limits, FakeClient("overlay2"))
    assert "storage_opt" not in hardened_kwargs(limits)  # no client: the static settings only


def test_daemon_config_names_the_btrfs_driver_only_on_its_own_filesystem(tmp_path):
    from sao_harness.envs.engine import ProjectEngine

    eng = ProjectEngine(tmp_path)
    host, btrfs = eng.daemon_config(), eng.daemon_config(btrfs=True)
    assert "storage-driver" not in host and host["data-root"] == str(tmp_path / "data")
    assert btrfs["storage-driver"] == "btrfs" and btrfs["data-root"] == str(tmp_path / "btrfs")
    assert eng.data_image == tmp_path / "data.btrfs" and eng.btrfs_root not in eng.data_image.parents


def test_a_data_root_with_data_on_the_host_is_never_hidden_under_a_mount(tmp_path, monkeypatch):
    import sao_harness.envs.datafs as datafs

    data = tmp_path / "data"
    (data / "overlay2").mkdir(parents=True)  # an engine's images, made before disk quotas
    monkeypatch.setattr(datafs, "_run", lambda argv: pytest.fail(f"ran {argv}"))
    logs = []
    assert datafs.mount_data_fs(data, tmp_path / "data.btrfs", 1 << 30, logs.append) is False
    assert not (tmp_path / "data.btrfs").exists()
    assert "no mount" in logs[0] and str(data) in logs[0] and "watchdog" in logs[0]


@pytest.mark.parametrize("failing", ["mount", "quota"])
def test_a_failed_mount_or_old_kernel_falls_back_and_leaves_no_half_made_image(tmp_path, monkeypatch, failing):
    import sao_harness.envs.datafs as datafs

    calls = []

    def run(argv):
        calls.append(argv[0].rsplit("/", 1)[-1])
        if calls[-1] == failing:
            raise datafs.EngineError("mount: no loop device")

    def quota(path):
        calls.append("quota")
        if failing == "quota":
            raise datafs.EngineError("cannot enable btrfs simple quotas (they need Linux >= 6.7)")

    monkeypatch.setattr(datafs, "_run", run)
    monkeypatch.setattr(datafs, "enable_simple_quotas", quota)
    monkeypatch.setattr(datafs, "ensure_programs", lambda programs, log=None: None)
    monkeypatch.setattr(datafs.subprocess, "run", lambda argv, **kw: calls.append("umount"))
    logs = []
    assert datafs.mount_data_fs(tmp_path / "data", tmp_path / "data.btrfs", 1 << 30, logs.append) is False
    expected = {"mount": ["mkfs.btrfs", "mount", "umount"], "quota": ["mkfs.btrfs", "mount", "quota", "umount"]}
    assert calls == expected[failing] and not (tmp_path / "data.btrfs").exists()
    assert ("no loop device" if failing == "mount" else "6.7") in logs[-1] and "watchdog" in logs[-1]


def test_mounted_fstype_reads_the_mount_table(tmp_path):
    from sao_harness.envs.datafs import mounted_fstype

    assert mounted_fstype(tmp_path) is None
    assert mounted_fstype(tmp_path.anchor) is not None  # "/" is always a mount


def test_docker_config_sizes_are_validated():
    assert size_bytes(DockerConfig().data_fs_size) == 64 << 30
    with pytest.raises(ValueError, match="size like"):
        DockerConfig(data_fs_size="lots")


# -- docker: the cap against the burst the watchdog cannot stop ---------------------------------------
def _burst(sb) -> int:
    """MiB allocated by ten 100 MiB fallocates (each under the 128 MiB file limit)."""
    out = sb.run("for i in $(seq 10); do fallocate -l 100M /f$i 2>/dev/null; done; du -sm /f* 2>/dev/null "
                 "| awk '{s+=$1} END {print s+0}'", 60).output
    return int(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def capped_engine(docker_engine, base_image):
    """A second project engine with docker.disk_quota: true on a private state dir (its own btrfs, its own
    network namespace), holding the base image; stopped and unmounted after."""
    import os
    import tempfile
    from pathlib import Path

    import docker

    from sao_harness.envs.datafs import mounted_fstype
    from sao_harness.envs.engine import ProjectEngine, start_project_engine, stop_project_engine

    if os.geteuid() != 0:
        pytest.skip("starting a project engine needs root")
    with tempfile.TemporaryDirectory(prefix="sao-capped-", dir="/tmp") as d:
        cfg = DockerConfig(state_dir=Path(d) / "s", netns=True, disk_quota=True)
        eng, logs, client = ProjectEngine(cfg.state_dir), [], None
        try:
            url = start_project_engine(cfg, log=logs.append)
            if mounted_fstype(eng.btrfs_root) != "btrfs":
                pytest.skip("no btrfs data root here: " + " / ".join(logs))
            client = docker.DockerClient(base_url=url, timeout=300)
            client.images.load(docker_engine.images.get(base_image).save(named=True))
            yield client
        finally:
            if client is not None:
                client.close()
            stop_project_engine(cfg)
            subprocess.run(["umount", "-R", str(eng.exec_root)], capture_output=True)
            subprocess.run(["umount", str(eng.btrfs_root)], capture_output=True)


@pytest.mark.docker
@pytest.mark.slow
def test_fallocate_burst_is_capped_by_the_kernel(capped_engine, base_image, test_run_id, monkeypatch, capsys):
    import sao_harness.envs.sandbox as sandbox_module
    from sao_harness.envs.limits import HARD_CAP_DRIVERS
    from tests.conftest import SMALL

    assert capped_engine.info()["Driver"] in HARD_CAP_DRIVERS

    def burst(**overrides) -> tuple[int, object]:
        cfg = SandboxConfig(**{**SMALL, "disk_bytes": "128m", **overrides})
        with sandbox_module.Sandbox(base_image, cfg, client=capped_engine, run_id=test_run_id) as sb:
            return _burst(sb), (sb.watchdog, sb.run("true").exit_code)

    capped, (watchdog, alive) = burst()
    assert capped <= 128, f"{capped} MiB allocated against a hard cap of 128 MiB"
    assert watchdog is None and alive == 0  # no poll needed; the sandbox lives on

    # power: the same burst on the same engine without the cap takes what it asks for
    monkeypatch.setattr(sandbox_module, "hard_disk_cap", lambda *a: {})
    uncapped, _ = burst(disk_check_s=60)  # the watchdog's poll out of the way
    assert uncapped >= 900, uncapped
    with capsys.disabled():
        print(f"\n[fallocate burst] {capped} MiB with the cap, {uncapped} MiB without (budget 128 MiB)")
