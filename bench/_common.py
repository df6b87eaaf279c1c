"""What the bench scripts share: the project importable from a bare checkout, and two small helpers.

Every script imports this module first (``python bench/x.py`` puts bench/ on ``sys.path``, so
``from _common import ...`` works with no install); importing it runs ``use_checkout()``, the one
place that makes the project's packages importable from the checkout.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository


def use_checkout() -> Path:
    """Put the repository root first on ``sys.path`` (its packages then import without an install); the root."""
    if sys.path[:1] != [str(ROOT)]:
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
