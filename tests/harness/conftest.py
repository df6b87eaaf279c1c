"""Fixtures of the harness tests: the Docker engine and base image for agent episodes (SDK loaded)."""
from __future__ import annotations

import pytest

from sao_harness.envs.config import DockerConfig
from sao_harness.envs.engine import docker_client
from sao_harness.envs.errors import EngineGone
from sao_harness.envs.images import base_tag, image_exists
from sao_harness.harness.agent import load_sdk


@pytest.fixture(scope="module")
def engine(docker_engine):
    """(docker client, base image) with the OpenHands SDK loaded; skips without an engine or image."""
    try:
        client = docker_client(DockerConfig())
    except EngineGone as e:
        pytest.skip(f"no Docker engine: {e}")
    image = base_tag(DockerConfig())
    if not image_exists(client, image):
        pytest.skip(f"base image {image} missing (make docker)")
    load_sdk()
    return client, image
