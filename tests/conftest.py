"""Fixtures shared by every test package: the project root, the tiny model, and the Docker engine with
its base image and sandboxes (started / built once per session).

Every test that uses the Docker engine, directly or through another fixture, is marked `docker`, so that
`make test-fast` (-m "not docker and not slow") leaves it out.
"""
from __future__ import annotations

import gc
import logging
import os
import uuid
from pathlib import Path

import pytest

from sao_harness.envs.config import DockerConfig, SandboxConfig
from sao_harness.envs.engine import ensure_engine
from sao_harness.envs.errors import EngineError
from sao_harness.envs.gc import cleanup_run
from sao_harness.envs.images import ensure_base_image
from sao_harness.envs.sandbox import Sandbox
from sao_harness.harness.tiny_model import ensure_tiny_model

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
logging.getLogger("torch").setLevel(logging.WARNING)  # the OpenHands SDK raises the root logger to INFO

SMALL = dict(memory="256m", cpus=1.0, pids_limit=128, command_timeout_s=30.0)  # limits of test sandboxes


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "docker_engine" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.docker)


@pytest.fixture(scope="session")
def project_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny Qwen3-MoE model + tokenizer, built once per recipe into .cache/sao."""
    return ensure_tiny_model(ROOT / ".cache" / "sao", seed=0)


@pytest.fixture(scope="session")
def docker_engine():
    """A client of the engine in use (the project engine is started if none answers)."""
    try:
        return ensure_engine(DockerConfig())
    except EngineError as e:
        pytest.skip(f"no Docker engine: {e}")


@pytest.fixture(scope="session")
def base_image(docker_engine) -> str:
    return ensure_base_image(docker_engine, DockerConfig())


@pytest.fixture(scope="session")
def test_run_id() -> str:
    """One run id for every sandbox of the test session; its leftovers are removed at the end."""
    run_id = f"pytest-envs-{uuid.uuid4().hex[:8]}"
    yield run_id
    cleanup_run(run_id)


@pytest.fixture
def make_sandbox(docker_engine, base_image, test_run_id):
    """``make_sandbox(**sandbox_config)`` -> a started Sandbox of the base image, closed after the test."""
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


def pytest_sessionfinish(session, exitstatus):
    """The OpenHands SDK raises logging to INFO; keep torch's exit-time statistics out of the summary."""
    for name in ["torch", *[n for n in logging.root.manager.loggerDict if n.startswith("torch.")]]:
        logging.getLogger(name).setLevel(logging.WARNING)


def pytest_unconfigure(config):
    """The interpreter's last collections at exit skip every object alive (~3 s less for a session that imported
    torch and the OpenHands SDK)."""
    gc.freeze()
