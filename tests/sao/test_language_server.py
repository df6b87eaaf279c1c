"""A language server resolves the namespace from a plain checkout: basedpyright (pyright, the engine of
Pylance and of pyright-langserver) reads `sao_harness.trainer.run.loop` as `trainer/run/loop.py` through
the committed links `sao_harness/<package> -> ../<package>` alone, with an interpreter that has no
sao_harness installed, no config file and no extra paths. Power check: without the link it cannot."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BASEDPYRIGHT = Path(sys.executable).with_name("basedpyright")
BARE_PYTHON = Path(sys.base_prefix) / "bin" / "python3"  # the venv's base interpreter: no sao_harness on it
PROBE = ("import sao_harness.trainer.run.loop as loop\n"
         "from sao_harness.tasks.grading.grade import GradeResult\n"
         "reveal_type(loop.train)\n"
         "reveal_type(GradeResult)\n")


def _checkout(tmp_path: Path) -> Path:
    """A plain checkout's layout: sao_harness/ as committed (relative links), each package folder there."""
    root = tmp_path / "checkout"
    shutil.copytree(ROOT / "sao_harness", root / "sao_harness", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    for link in (root / "sao_harness").iterdir():
        if link.is_symlink():
            (root / link.name).symlink_to(ROOT / link.name, target_is_directory=True)
    (root / "probe.py").write_text(PROBE)
    return root


def _diagnostics(root: Path) -> list[dict]:
    out = subprocess.run([str(BASEDPYRIGHT), "--outputjson", "--pythonpath", str(BARE_PYTHON), "probe.py"], cwd=root,
                         capture_output=True, text=True, timeout=300)
    return json.loads(out.stdout)["generalDiagnostics"]


def test_the_namespace_resolves_for_a_language_server_from_a_plain_checkout(tmp_path):
    bare = subprocess.run([str(BARE_PYTHON), "-c", "import sao_harness"], cwd=tmp_path, capture_output=True)
    assert bare.returncode != 0, "the base interpreter has sao_harness installed: not a plain checkout's view"
    root = _checkout(tmp_path)
    found = _diagnostics(root)
    assert not [d for d in found if d.get("rule") == "reportMissingImports"], found
    revealed = [d["message"] for d in found if d["severity"] == "information"]
    assert any('Type of "loop.train" is "(cfg:' in m for m in revealed), revealed  # the function, read from source
    assert any('Type of "GradeResult" is "type[GradeResult]"' in m for m in revealed), revealed

    (root / "sao_harness" / "trainer").unlink()  # power: without the link the same probe does not resolve
    missing = [d["message"] for d in _diagnostics(root) if d.get("rule") == "reportMissingImports"]
    assert missing == ['Import "sao_harness.trainer.run.loop" could not be resolved'], missing
