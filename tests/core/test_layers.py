"""The package layers: one-way imports (import-linter), and imports at module top.

Layers, bottom to top: core < envs < tasks < harness < trainer < eval < sao, each the folder of
``sao_harness.<layer>``; inside trainer/ and tasks/, their rooms. The contracts (one per layer, one per
package of rooms, and the rooms' config modules) live in pyproject.toml; `make lint` runs them through
scripts/lint_imports.py too. The second test shows they have power: the same check on a copy of the
tree with a backward import between layers, and one between rooms of each package, fails on each.
"""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "sao_harness"
# The product's folders: the ones sao_harness/ links to (sao_harness/core -> ../core, ...), the one mapping.
PACKAGES = tuple(sorted(link.name for link in (ROOT / NAMESPACE).iterdir() if link.is_symlink()))
LINT_IMPORTS = ROOT / "scripts" / "lint_imports.py"
CONTRACTS = len(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"])


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(LINT_IMPORTS), str(root)], capture_output=True, text=True,
                          timeout=300)


def test_layers_contracts_are_kept():
    out = _lint_imports(ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert CONTRACTS >= len(PACKAGES) - 1 + 2  # one per layer but the top one, one per package of rooms
    assert f"{CONTRACTS} kept, 0 broken" in out.stdout


def test_a_backward_import_breaks_the_contract(tmp_path):
    """Power check: core importing sao (a backward import, even inside a function) fails its layer's contract;
    a room importing a room above it (trainer's modeling the loop, tasks' formats the grader) fails its own."""
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("suite", "bundled", "__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(ROOT / NAMESPACE, tmp_path / NAMESPACE, symlinks=True)  # its links reach the copies
    (tmp_path / "core" / "backward.py").write_text(
        "def f():\n    from sao_harness.sao import cli  # noqa\n    return cli\n")
    (tmp_path / "trainer" / "modeling" / "backward.py").write_text("from sao_harness.trainer.run import loop  # noqa\n")
    (tmp_path / "tasks" / "formats" / "backward.py").write_text("import sao_harness.tasks.grading.grade  # noqa\n")
    out = _lint_imports(tmp_path)
    assert out.returncode != 0
    assert f"{CONTRACTS - 3} kept, 3 broken" in out.stdout, out.stdout[-2000:]
    for line in ("sao_harness.core.backward -> sao_harness.sao.cli",
                 "sao_harness.trainer.modeling.backward -> sao_harness.trainer.run.loop",
                 "sao_harness.tasks.formats.backward -> sao_harness.tasks.grading.grade"):
        assert line in out.stdout, out.stdout[-3000:]


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


def _module_name(root: Path, path: Path) -> str:
    """``sao_harness.<folder>.<module>``: the installed name of the file at ``path`` under ``root``."""
    parts = [NAMESPACE, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_imports(root: Path, packages=PACKAGES) -> dict[str, set[str]]:
    """module -> the project modules it imports, anywhere in it (at the top, under TYPE_CHECKING, or
    lazily inside a function: a lazy import hides a circle, it does not cut it). ``from a import b``
    counts as an import of ``a.b`` when that is a module, else of ``a``."""
    files = {_module_name(root, p): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))
             if not {"suite", "bundled", "__pycache__"} & set(p.parts)}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        deps: set[str] = set()
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in files:  # `import a.b.c` of a non-module name: its nearest module
                    t = t.rpartition(".")[0]
                if t and t != mod:
                    deps.add(t)
        graph[mod] = deps
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    """No two project modules import each other, directly or through others."""
    cycles = import_cycles(module_imports(ROOT))
    assert not cycles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_an_import_circle_is_found(tmp_path):
    """Power check: a two-module circle (one side under TYPE_CHECKING), a three-module one and one through
    a lazy import are found."""
    pkg = tmp_path / "core"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""x"""\n')
    (pkg / "a.py").write_text("from sao_harness.core.b import f\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\n"
                              "if TYPE_CHECKING:\n    from sao_harness.core import a\n")
    (pkg / "c.py").write_text("from . import d\n")
    (pkg / "d.py").write_text("import sao_harness.core.e\n")
    (pkg / "e.py").write_text("from .c import g\n")
    (pkg / "f.py").write_text("def f():\n    from sao_harness.core import g  # lazy: test\n")
    (pkg / "g.py").write_text("import sao_harness.core.f\n")
    ns = NAMESPACE + ".core"
    assert import_cycles(module_imports(tmp_path, ("core",))) == [
        [f"{ns}.a", f"{ns}.b"], [f"{ns}.c", f"{ns}.d", f"{ns}.e"], [f"{ns}.f", f"{ns}.g"]]


def bare_imports(paths) -> list[str]:
    """``file:line: module`` for every import of a project folder by its bare name (``core.x`` instead of
    ``sao_harness.core.x``): in a checkout it would load a second copy of the module, with its own classes."""
    bad = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            bad += [f"{path}:{node.lineno}: {n}" for n in names if n.split(".")[0] in PACKAGES]
    return bad


def test_every_import_goes_through_the_namespace(tmp_path):
    files = [p for d in (*PACKAGES, "tests", "bench", "scripts") for p in sorted((ROOT / d).rglob("*.py"))
             if not {"suite", "bundled", "__pycache__"} & set(p.parts)]
    assert len(files) > 200 and not bare_imports(files), "\n".join(bare_imports(files))
    (tmp_path / "m.py").write_text("import os\nfrom sao_harness.core import files\nfrom trainer.algo.gae import gae\n")
    assert bare_imports([tmp_path / "m.py"]) == [f"{tmp_path / 'm.py'}:3: trainer.algo.gae"]  # power: one is found
