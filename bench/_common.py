"""What the bench scripts share: the checkout's root on ``sys.path``, and two small helpers.

Every script imports this module first (``python bench/x.py`` puts bench/ on ``sys.path``, so
``from _common import ...`` works with no install); importing it puts the root first on ``sys.path``,
so ``sao_harness`` is the checkout's (its links ``sao_harness/trainer -> ../trainer``, ...; no install
needed: the GPU machine runs bench/gpu_update.py from a bare checkout) and ``tests.support`` resolves.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository
if sys.path[:1] != [str(ROOT)]:
    sys.path.insert(0, str(ROOT))


def verdict(ok: bool) -> str:
    """``PASS`` / ``FAIL``: how a bench prints whether it met its target."""
    return "PASS" if ok else "FAIL"


def fixed_update(seconds: float):
    """An ``update_fn`` for ``trainer.run.loop.train`` that costs a fixed ``seconds`` (no model): it sleeps, takes
    the policy to the next version and reports ``rollout/trajectories``, so a bench measures the pipeline."""
    def update(trainer, trajectories):
        time.sleep(seconds)
        trainer.policy_version += 1
        return {"rollout/trajectories": float(len(trajectories))}
    return update
