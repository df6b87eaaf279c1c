"""Session fixtures for the envs tests: the engine (started once) and the base image (built once).

Import them into a test module: ``from envs_fixtures import docker_engine, base_image, sandbox``.
"""
from __future__ import annotations

import pytest

SMALL = dict(memory="256m", cpus=1.0, pids_limit=128, command_timeout_s=30.0)


@pytest.fixture(scope="session")
def docker_engine():
    """A client of the engine in use (the project engine is started if none answers)."""
    from envs.config import DockerConfig
    from envs.engine import ensure_engine
    from envs.errors import EngineError

    try:
        return ensure_engine(DockerConfig())
    except EngineError as e:
        pytest.skip(f"no Docker engine: {e}")


@pytest.fixture(scope="session")
def base_image(docker_engine) -> str:
    from envs.config import DockerConfig
    from envs.images import ensure_base_image

    return ensure_base_image(docker_engine, DockerConfig())


@pytest.fixture(scope="session")
def test_run_id() -> str:
    """One run id for every sandbox of the test session; its leftovers are removed at the end."""
    import uuid

    from envs.gc import cleanup_run

    run_id = f"pytest-envs-{uuid.uuid4().hex[:8]}"
    yield run_id
    cleanup_run(run_id)


@pytest.fixture
def make_sandbox(docker_engine, base_image, test_run_id):
    """``make_sandbox(**sandbox_config)`` -> a started Sandbox of the base image, closed after the test."""
    from envs.config import SandboxConfig
    from envs.sandbox import Sandbox

    made = []

    def make(image: str | None = None, **overrides):
        cfg = SandboxConfig(**{**SMALL, **overrides})
        sb = Sandbox(image or base_image, cfg, client=docker_engine, run_id=test_run_id)
        made.append(sb)
        return sb

    yield make
    for sb in made:
        sb.close()


@pytest.fixture
def sandbox(make_sandbox):
    """A fresh sandbox with the small test limits."""
    return make_sandbox()
