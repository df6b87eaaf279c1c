"""What the bench scripts share: the project importable from a bare checkout, and two small helpers.

Every script imports this module first (``python bench/x.py`` puts bench/ on ``sys.path``, so
``from _common import ...`` works with no install); importing it runs ``use_checkout()``, the one
place that makes the project's packages importable from the checkout.
"""
from __future__ import annotations

import importlib.util
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository


def use_checkout() -> Path:
    """Make ``sao_harness.<folder>`` importable from this checkout; the root.

    Installed (``make setup``: editable), nothing to do. A bare checkout (the GPU machine runs
    bench/gpu_update.py with no install): ``sao_harness`` is made a package whose path is the root, so
    ``sao_harness.trainer`` is ``<root>/trainer``, as pyproject.toml's package-dir maps it.
    """
    if importlib.util.find_spec("sao_harness") is None:
        package = types.ModuleType("sao_harness", "sao-harness, from a bare checkout (bench/_common.py)")
        package.__path__ = [str(ROOT)]
        sys.modules["sao_harness"] = package
    if sys.path[:1] != [str(ROOT)]:  # tests.support and the like, as from the checkout's root
        sys.path.insert(0, str(ROOT))
    return ROOT


use_checkout()


def verdict(ok: bool) -> str:
    """``PASS`` / ``FAIL``: how a bench prints whether it met its target."""
    return "PASS" if ok else "FAIL"


def fixed_update(seconds: float):
    """An ``update_fn`` for ``trainer.loop.train`` that costs a fixed ``seconds`` (no model): it sleeps, takes
    the policy to the next version and reports ``rollout/trajectories``, so a bench measures the pipeline."""
    def update(trainer, trajectories):
        time.sleep(seconds)
        trainer.policy_version += 1
        return {"rollout/trajectories": float(len(trajectories))}
    return update
