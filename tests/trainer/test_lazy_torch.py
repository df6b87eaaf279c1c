"""Processes that need no torch do not import it (1.9 s of CPU each): the `sao` command line before a command
runs, and the module every Ray actor of `sao train` loads (the rollout workers and the task feed)."""
from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["sao_harness.sao.cli", "sao_harness.trainer.run.actors"])
def test_importing_leaves_torch_unloaded(module):
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False", f"importing {module} loads torch"
