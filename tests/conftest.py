"""Shared fixtures: the tiny model (built once into the project cache) and the project root."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def project_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny Qwen3-MoE model + tokenizer, built once per recipe into .cache/sao."""
    from harness.tiny_model import ensure_tiny_model

    return ensure_tiny_model(ROOT / ".cache" / "sao", seed=0)

import logging  # noqa: E402

logging.getLogger("torch").setLevel(logging.WARNING)  # the OpenHands SDK raises the root logger to INFO
