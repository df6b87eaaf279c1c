"""The package layers: one-way imports (import-linter), and imports at module top.

Layers, bottom to top: core < envs < tasks < harness < trainer < eval < sao. The contract lives in
pyproject.toml; `make lint` runs it too. The second test shows the contract has power: the same
check on a copy of the tree with one backward import fails.
"""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("core", "envs", "tasks", "harness", "trainer", "eval", "sao")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT_IMPORTS), "--config", str(root / "pyproject.toml")], cwd=root,
                          capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})


def test_layers_contract_is_kept():
    out = _lint_imports(ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "1 kept, 0 broken" in out.stdout


def test_a_backward_import_breaks_the_contract(tmp_path):
    """Power check: core importing sao (a backward import, even inside a function) fails the contract."""
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("suite", "bundled", "__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "core" / "backward.py").write_text("def f():\n    from sao import cli  # noqa\n    return cli\n")
    out = _lint_imports(tmp_path)
    assert out.returncode != 0
    assert "0 kept, 1 broken" in out.stdout and "core.backward -> sao.cli" in out.stdout, out.stdout[-2000:]


def _noted(lines: list[str], lineno: int) -> bool:
    """A `# lazy: why` note on the import's line, or a comment heading the block of imports it is in."""
    if "# lazy:" in lines[lineno - 1]:
        return True
    for line in reversed(lines[:lineno - 1]):
        text = line.strip()
        if "# lazy:" in text:
            return True
        if not (text.startswith(("import ", "from ", "#")) or re.fullmatch(r"[\w., ]+\)?", text)):
            return False  # the block of imports (and its comments) ended without a note
    return False


def _function_imports(path: Path):
    """(line number, module, has a `# lazy:` note) for every import inside a function of ``path``."""
    source = path.read_text()
    lines = source.splitlines()
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mods = [("." * node.level) + (node.module or "")]
            else:
                continue
            noted = _noted(lines, node.lineno)
            for mod in mods:
                yield node.lineno, mod, noted


def _package_files():
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if {"suite", "bundled"} & set(path.parts):
                continue
            yield path


def test_imports_inside_functions_are_only_lazy_ones_with_a_reason():
    """An import inside a function is for a heavy or optional dependency (torch, ray, the SDK, vLLM, or a
    project module that pulls one in), or a CLI handler keeping ``sao --help`` fast; it says why in a
    `# lazy:` note. Everything else is imported at module top. (import-linter sees these imports too.)"""
    bad = []
    for path in _package_files():
        rel = path.relative_to(ROOT)
        for line, mod, noted in _function_imports(path):
            if not noted:
                bad.append(f"{rel}:{line}: '{mod}' imported inside a function without a '# lazy: why' note")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("pkg", PACKAGES)
def test_every_package_says_what_it_holds(pkg):
    init = ROOT / pkg / "__init__.py"
    assert init.is_file() and ast.get_docstring(ast.parse(init.read_text())), f"{pkg}/__init__.py needs a docstring"
