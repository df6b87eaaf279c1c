"""The engine bootstrap and the images, against the real engine."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]
SAO = [str(ROOT / ".venv" / "bin" / "sao")] if (ROOT / ".venv" / "bin" / "sao").exists() else None


def test_ensure_engine_is_idempotent_and_exports_docker_host(docker_engine):
    from sao_harness.envs.config import DockerConfig
    from sao_harness.envs.engine import docker_client, ensure_engine

    t0 = time.monotonic()
    client = ensure_engine(DockerConfig())
    assert time.monotonic() - t0 < 2
    assert os.environ["DOCKER_HOST"] == client.sao_docker_host
    assert client.ping() and docker_client().ping()
    import docker

    assert docker.from_env().ping()  # what swebench does


def test_project_engine_has_only_host_and_none_networks(docker_engine):
    from sao_harness.envs.config import DockerConfig
    from sao_harness.envs.datafs import mounted_fstype
    from sao_harness.envs.engine import ProjectEngine

    eng = ProjectEngine(DockerConfig().state_dir)
    if docker_engine.sao_docker_host != eng.url:
        pytest.skip("an existing engine is in use, not the project engine")
    assert sorted(n.name for n in docker_engine.networks.list()) == ["host", "none"]
    info = docker_engine.info()
    assert info["DockerRootDir"] in (str(eng.data_root), str(eng.btrfs_root))
    assert not str(eng.state_dir).startswith(str(ROOT))  # images survive a fresh clone
    if info["DockerRootDir"] == str(eng.btrfs_root):  # docker.disk_quota: the driver that caps disks hard
        assert info["Driver"] == "btrfs" and mounted_fstype(eng.btrfs_root) == "btrfs"
    assert eng.pid() is not None


@pytest.mark.skipif(SAO is None, reason="no .venv/bin/sao")
def test_sao_docker_up_twice_is_instant_and_status_reports(docker_engine):
    import re

    for _ in range(2):
        out = subprocess.run(SAO + ["docker", "up"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert "answers at" in out.stdout
    took = float(re.search(r"\(([0-9.]+) s\)", out.stdout).group(1))  # the engine part, imports aside
    assert took < 2, out.stdout
    st = subprocess.run(SAO + ["docker", "status"], capture_output=True, text=True, timeout=60)
    assert st.returncode == 0 and "server_version" in st.stdout


def test_docker_cli_reaches_the_engine_via_docker_host(docker_engine):
    out = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True,
                         env={**os.environ, "DOCKER_HOST": docker_engine.sao_docker_host}, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == docker_engine.version()["Version"]


# -- images ---------------------------------------------------------------------------------------
def test_base_image_content_and_labels(docker_engine, base_image, make_sandbox):
    from sao_harness.envs.config import DockerConfig
    from sao_harness.envs.images import base_tag, ensure_base_image

    t0 = time.monotonic()
    assert ensure_base_image(docker_engine, DockerConfig()) == base_image  # found, not rebuilt
    assert time.monotonic() - t0 < 2
    if DockerConfig().base_image is None:
        assert base_image == base_tag(DockerConfig())
    labels = docker_engine.images.get(base_image).labels or {}
    assert "sao-harness.owner" not in labels  # containers inherit image labels: only ours carry it
    sb = make_sandbox()
    r = sb.run("python3 --version; python --version; python3 -m pytest --version 2>&1 | head -1; git --version; "
               "patch --version | head -1; ps --version; ls /var/lib/apt/lists | wc -l; "
               "python3 -m venv /tmp/v && /tmp/v/bin/python -c 'print(1)'", timeout_s=60)
    out = r.output
    assert r.exit_code == 0, out
    assert "Python 3.11" in out and "pytest" in out and "git version" in out and "GNU patch" in out
    assert "procps" in out and out.rstrip().endswith("1")


def test_image_save_and_load_round_trip(docker_engine, tmp_path):
    from sao_harness.envs.images import image_exists, import_rootfs, load_image_file, save_image_file

    root = tmp_path / "rootfs"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "hello").write_text("hi\n")
    tag = f"sao-harness/test-tiny:{os.getpid()}"
    import_rootfs(docker_engine, root, tag, changes=())
    try:
        cache = tmp_path / "cache" / "tiny.tar.gz"
        save_image_file(docker_engine, tag, cache)
        assert cache.stat().st_size > 0 and cache.read_bytes()[:2] == b"\x1f\x8b"
        docker_engine.images.remove(tag, force=True)
        assert not image_exists(docker_engine, tag)
        load_image_file(docker_engine, cache)
        assert image_exists(docker_engine, tag)
    finally:
        try:
            docker_engine.images.remove(tag, force=True)
        except Exception:
            pass


def test_ensure_base_image_loads_from_the_tarball_cache(docker_engine, tmp_path, monkeypatch):
    """The cache branch: a tarball named after the tag is loaded instead of building."""
    from sao_harness.envs import images
    from sao_harness.envs.config import DockerConfig

    root = tmp_path / "rootfs"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "x").write_text("x")
    tag = f"sao-harness/test-cache:{os.getpid()}"
    import_rootfs = images.import_rootfs
    import_rootfs(docker_engine, root, tag, changes=())
    cfg = DockerConfig(image_cache_dir=tmp_path / "cache", state_dir=tmp_path / "state")
    cache = images._cache_file(cfg, tag)
    images.save_image_file(docker_engine, tag, cache)
    docker_engine.images.remove(tag, force=True)
    monkeypatch.setattr(images, "base_tag", lambda c: tag)
    monkeypatch.setattr(images, "build_base_image", lambda *a, **k: pytest.fail("built instead of loading"))
    try:
        assert images.ensure_base_image(docker_engine, cfg, log=lambda m: None) == tag
        assert images.image_exists(docker_engine, tag)
    finally:
        docker_engine.images.remove(tag, force=True)


def test_build_image_with_wheels_offline(docker_engine, base_image, make_sandbox):
    from sao_harness.envs.images import build_image_with_wheels, wheels_tag

    tag = wheels_tag(base_image, ["iniconfig==2.0.0"])
    try:
        docker_engine.images.remove(tag, force=True)
    except Exception:
        pass
    t0 = time.monotonic()
    assert build_image_with_wheels(base_image, ["iniconfig==2.0.0"], client=docker_engine, log=lambda m: None) == tag
    assert time.monotonic() - t0 < 90
    sb = make_sandbox(image=tag)
    r = sb.run("python3 -c 'import iniconfig, sys; print(iniconfig.__file__)'; ls /tmp/sao-wheels 2>&1 | head -1")
    assert "/usr/local/lib/python3.11" in r.output and "No such file" in r.output
    # a second call reuses the image
    t0 = time.monotonic()
    build_image_with_wheels(base_image, ["iniconfig==2.0.0"], client=docker_engine, log=lambda m: None)
    assert time.monotonic() - t0 < 2


@pytest.mark.skipif(os.geteuid() != 0, reason="starting a project engine needs root")
def test_a_second_project_engine_starts_answers_and_stops(docker_engine):
    """Lifecycle on a private state dir (what `sao docker up` / `down` do), without touching the main one."""
    import tempfile

    from sao_harness.envs.config import DockerConfig
    from sao_harness.envs.datafs import mounted_fstype
    from sao_harness.envs.engine import ProjectEngine, probe, start_project_engine, stop_project_engine

    with tempfile.TemporaryDirectory(prefix="sao-eng-", dir="/tmp") as d:
        cfg = DockerConfig(state_dir=Path(d) / "s", netns=True)  # own network namespace: cannot touch the host
        eng = ProjectEngine(cfg.state_dir)
        try:
            assert start_project_engine(cfg, log=lambda m: None) == eng.url
            assert probe(eng.url)[0] and eng.pid() is not None
            if mounted_fstype(eng.btrfs_root) is not None:  # docker.disk_quota: its own btrfs, quotas on from the start
                assert mounted_fstype(eng.btrfs_root) == "btrfs"
                qgroups = subprocess.run(["btrfs", "qgroup", "show", str(eng.btrfs_root)], capture_output=True,
                                         text=True)
                assert qgroups.returncode == 0, qgroups.stderr
            t0 = time.monotonic()
            assert start_project_engine(cfg, log=lambda m: None) == eng.url  # idempotent
            assert time.monotonic() - t0 < 1
        finally:
            assert stop_project_engine(cfg)
        assert not probe(eng.url)[0] and eng.pid() is None
        assert not stop_project_engine(cfg)
        subprocess.run(["umount", "-R", str(eng.exec_root)], capture_output=True)
        subprocess.run(["umount", str(eng.btrfs_root)], capture_output=True)  # docker.disk_quota's mount
