"""Task images on every node (envs.pull, tasks.images, `sao images pull`), on two Docker engines.

A second dockerd (its own socket, data root, exec root and pid file, beside the project engine) stands in
for a sandbox node. Images are tiny (`docker import` of one small file), so save / load takes milliseconds:
- an image on one engine only is fetched to the other: from the other engine (`engine:` source), or from
  a directory of `docker save` tarballs (`dir:` source) by `sao images pull` on a local multi-raylet Ray
  cluster, each raylet with its own engine;
- the disk budget evicts the least recently used image, never the base image nor one a container uses;
- an episode whose image no source has ends as an infra error naming each source, not a crash.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import uuid
from pathlib import Path

import pytest

from sao_harness.envs.config import DockerConfig
from sao_harness.envs.engine import _client, start_project_engine, stop_project_engine
from sao_harness.envs.errors import EngineError
from sao_harness.envs.pull import ImagePullError, ensure_image, fetch_images, read_record, record_path, save_images
from sao_harness.harness.trace import Status


@pytest.fixture(scope="session")
def second_engine(docker_engine):
    """A second project-style dockerd under a fresh state dir; stopped and removed at the end."""
    cfg = DockerConfig(state_dir=Path(tempfile.mkdtemp(prefix="sao-eng2-", dir="/tmp")))
    try:
        url = start_project_engine(cfg, log=lambda m: None)
    except EngineError as e:
        shutil.rmtree(cfg.state_dir, ignore_errors=True)
        pytest.skip(f"no second Docker engine: {e}")
    client = _client(url)
    yield client
    client.close()
    stop_project_engine(cfg)
    shutil.rmtree(cfg.state_dir, ignore_errors=True)


@pytest.fixture
def make_image(docker_engine, second_engine):
    """``make_image(name)`` -> a tiny image on the project engine only; removed from both engines after."""
    repo = f"sao-harness-test/pull-{uuid.uuid4().hex[:8]}"
    made = []

    def make(name: str) -> str:
        payload = os.urandom(1024)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo("payload")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
        docker_engine.api.import_image_from_data(buf.getvalue(), repository=repo, tag=name,
                                                 changes=['CMD ["/payload"]'])
        made.append(f"{repo}:{name}")
        return made[-1]

    yield make
    for client in (docker_engine, second_engine):
        for c in client.api.containers(all=True, filters={"label": f"sao-harness-test={repo}"}):
            client.api.remove_container(c["Id"], force=True)
        for image in made:
            try:
                client.api.remove_image(image, force=True)
            except Exception:  # noqa: BLE001  (not on that engine)
                pass


def _present(client, image: str) -> bool:
    return any(image in (i.get("RepoTags") or []) for i in client.api.images())


def test_an_image_on_one_engine_is_fetched_from_it(docker_engine, second_engine, make_image, tmp_path):
    """engine: source after a dir: source that lacks it; a name in no source is an ImagePullError naming each."""
    image = make_image("one")
    (tmp_path / "empty").mkdir()
    cfg = DockerConfig(state_dir=tmp_path, pull_retries=0,
                       image_sources=[f"dir:{tmp_path / 'empty'}", f"engine:{docker_engine.sao_docker_host}"])
    assert not _present(second_engine, image)
    out = fetch_images(second_engine, [image], cfg, progress=False, log=lambda m: None)
    assert out["pulled"] == {image: f"engine:{docker_engine.sao_docker_host}"} and not out["failed"]
    assert second_engine.images.get(image).id == docker_engine.images.get(image).id
    assert ensure_image(image, cfg, client=second_engine) is None  # present now: nothing fetched
    assert image in read_record(record_path(second_engine, cfg))

    with pytest.raises(ImagePullError) as e:
        ensure_image(image.replace(":one", ":absent"), cfg, client=second_engine)
    assert f"dir:{tmp_path / 'empty'}: no " in str(e.value) and f"engine:{docker_engine.sao_docker_host}: not on" \
        in str(e.value)


def test_the_disk_budget_evicts_the_least_recently_used(docker_engine, second_engine, make_image, tmp_path):
    """A (a container uses it), B (the base image), C, D fetched in that order under a budget of 4.5 images,
    then C used again: fetching E evicts D, the least recently used one that is neither in use nor the base."""
    a, b, c, d, e = (make_image(n) for n in "abcde")
    size = docker_engine.api.inspect_image(a)["Size"]
    cfg = DockerConfig(state_dir=tmp_path, base_image=b, image_cache_bytes=str(4 * size + size // 2),
                       image_sources=[f"engine:{docker_engine.sao_docker_host}"])
    ensure_image(a, cfg, client=second_engine)
    second_engine.api.create_container(a, labels={"sao-harness-test": a.split(":")[0]})  # made, never started
    for image in (b, c, d):
        ensure_image(image, cfg, client=second_engine)
    assert ensure_image(c, cfg, client=second_engine) is None  # a use: C is now more recent than D
    assert all(_present(second_engine, i) for i in (a, b, c, d))  # within the budget
    ensure_image(e, cfg, client=second_engine)
    assert [_present(second_engine, i) for i in (a, b, c, d, e)] == [True, True, True, False, True]
    assert set(read_record(record_path(second_engine, cfg))) == {a, b, c, e}


def test_a_failing_source_is_retried_with_backoff_then_the_next_is_tried(monkeypatch, tmp_path):
    """A source that fails is retried pull_retries times, after backoff, 2 x backoff, ...; one that lacks
    the image is skipped at once; the error names every source."""
    from sao_harness.envs import pull  # lazy: the module under test, patched

    calls, sleeps, loaded = [], [], set()

    def flaky(client, image, arg):
        calls.append(image)
        if len(calls) <= 2:
            raise ConnectionError("registry hiccup")
        loaded.add(image)

    def lacks(client, image, arg):
        raise pull.NotInSource(f"no {arg}/{pull.tarball_name(image)}")

    monkeypatch.setattr(pull, "SOURCES", {"registry": flaky, "dir": lacks})
    monkeypatch.setattr(pull, "image_exists", lambda client, image: image in loaded)
    monkeypatch.setattr(pull.time, "sleep", sleeps.append)
    cfg = DockerConfig(state_dir=tmp_path, image_sources=["dir:/nowhere", "registry"], pull_retries=2,
                       pull_backoff_s=0.5)
    assert pull.fetch(None, "a/b:1", cfg) == "registry" and calls == ["a/b:1"] * 3 and sleeps == [0.5, 1.0]
    calls.clear()
    with pytest.raises(ImagePullError) as e:
        pull.fetch(None, "a/b:2", cfg.model_copy(update={"pull_retries": 1}))
    assert str(e.value).endswith("dir:/nowhere: no /nowhere/a+b=2.tar; registry: ConnectionError: registry hiccup "
                                 "(after 2 attempt(s))")


class _NoProxy:
    base_url = "http://127.0.0.1:9"

    def close_episode(self, episode_id):
        from sao_harness.harness.proxy import UnknownEpisode  # lazy: the harness layer, only this test needs it

        raise UnknownEpisode(episode_id)


def test_an_image_no_source_has_is_an_infra_error_of_the_episode(docker_engine, tmp_path):
    """run_episode pulls on a miss; when no source has the image the episode is infra_error, saying why."""
    from sao_harness.harness.episode import EpisodeContext, run_episode  # lazy: the harness layer
    from sao_harness.sao.config import load_config  # lazy: the full config
    from sao_harness.tasks.model import Task  # lazy: the tasks layer

    cfg = load_config(None, [f"docker.host={docker_engine.sao_docker_host}", f"docker.state_dir={tmp_path}",
                             f"docker.image_sources=[dir:{tmp_path}]", f"run.root={tmp_path}"])
    task = Task(instance_id="absent-1", repo="x/y", base_commit="0" * 40, problem_statement="p", FAIL_TO_PASS=[],
                PASS_TO_PASS=[], image=f"sao-harness-test/absent-{uuid.uuid4().hex[:8]}:x")
    traj = run_episode(task, EpisodeContext(cfg=cfg, proxy=_NoProxy(), run_id="pytest-pull"))
    assert traj.status == Status.INFRA_ERROR and traj.reward is None
    why = traj.metadata[Status.INFRA_ERROR]
    assert why.startswith("ImagePullError: ") and task.image in why and f"dir:{tmp_path}: no " in why


@pytest.mark.slow
def test_sao_images_pull_fetches_on_each_sandbox_node(docker_engine, second_engine, make_image, tmp_path,
                                                      project_root, monkeypatch):
    """Two raylets on 127.0.0.1, each with its own engine: the head (the project engine, which has the image)
    and a sandbox node (`docker` resource, the second engine, which has not). `sao images pull` with a
    dir: source of `docker save` tarballs fetches it on the sandbox node only."""
    from ray._private import ray_constants  # lazy: Ray only for the cluster test
    from ray.cluster_utils import Cluster  # lazy: Ray only for the cluster test

    image = make_image("cluster")
    tarballs = tmp_path / "tarballs"
    save_images(docker_engine, [image], tarballs, log=lambda m: None)
    rows = tmp_path / "rows.jsonl"
    row = {"instance_id": "tiny__img-1", "repo": "sao/tiny", "base_commit": "0" * 40, "image": image,
           "problem_statement": "-", "FAIL_TO_PASS": [], "PASS_TO_PASS": []}
    rows.write_text(json.dumps(row) + "\n")
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # every Ray server binds 127.0.0.1
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
    common = {"node_ip_address": "127.0.0.1", "include_dashboard": False, "num_cpus": 1}
    cluster = Cluster(initialize_head=True, head_node_args={
        **common, "resources": {"trainer": 1}, "env_vars": {"DOCKER_HOST": docker_engine.sao_docker_host}})
    try:
        cluster.add_node(**common, resources={"docker": 1}, env_vars={"DOCKER_HOST": second_engine.sao_docker_host})
        config = tmp_path / "pull.yaml"
        config.write_text(f"tasks: {{source: {rows}}}\n"
                          f"docker: {{image_sources: ['dir:{tarballs}'], state_dir: {tmp_path / 'state'}}}\n"
                          f"runtime: {{ray_address: '{cluster.address}'}}\n"
                          "rollout: {node_resources: {docker: 1}}\n"
                          "sandbox: {scrub_history: never}\n")  # the image holds no repository to scrub
        out = subprocess.run([sys.executable, "-m", "sao_harness.sao.cli", "images", "pull", "--config", str(config)],
                             cwd=project_root, capture_output=True, text=True, timeout=180,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
    finally:
        cluster.shutdown()
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("node ")]
    assert len(lines) == 1 and f"(engine {second_engine.sao_docker_host}): 1 image(s): 0 present, 1 fetched from " \
        f"dir:{tarballs}, 0 failed" in lines[0], out.stdout
    assert second_engine.images.get(image).id == docker_engine.images.get(image).id
