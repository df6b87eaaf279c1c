"""The GPU environment (requirements-gpu.txt) resolves: a resolver dry run against PyPI (metadata only)."""
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_environment_resolves():
    r = subprocess.run(["bash", "scripts/gpu_env.sh", "check"], check=False, cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "resolves vllm==0.33.0" in r.stdout and "resolves torch==2.14.0" in r.stdout
