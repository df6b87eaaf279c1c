"""The `gpu` extra resolves: a resolver dry run of ``pip install -e '.[gpu]'`` against PyPI (metadata only).

vLLM, the base pins (its exact torch) and the OpenHands SDK in one environment: the pins of
pyproject.toml must come out of the resolution as they are written there.
"""
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def pin(reqs: list[str], name: str) -> str:
    [version] = [m.group(1) for r in reqs if (m := re.fullmatch(rf"{name}==(\S+)", r))]
    return version


@pytest.mark.slow
def test_gpu_extra_resolves():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base, gpu = project["dependencies"], project["optional-dependencies"]["gpu"]
    expected = {"vllm": pin(gpu, "vllm"), "torch": pin(base, "torch"), "transformers": pin(base, "transformers"),
                "openhands-sdk": pin(base, "openhands-sdk")}
    r = subprocess.run(["bash", "scripts/gpu_env.sh"], check=False, cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    for name, version in expected.items():
        assert f"gpu_env: resolves {name}=={version}\n" in r.stdout, (name, version, r.stdout)
