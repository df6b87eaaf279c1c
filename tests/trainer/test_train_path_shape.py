"""The train path stays readable: no product function over 80 lines (the train path and every other), and no
`trainer.env ==` branch in trainer/ or its rooms (an env says what it needs in its spec, harness.runner.ENVS).
Each check is shown to fail on a synthetic source that breaks it."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRAINER = ROOT / "trainer"
PRODUCT = ("core", "envs", "tasks", "harness", "trainer", "eval", "sao")
NOT_PRODUCT = ("tasks/suite/", "tasks/bundled/")  # the bundled tasks' generator and the tasks' own code
MAX_LINES = 80


def product_files() -> list[Path]:
    """Every .py file of the product's folders, rooms included (not the bundled tasks or their generator)."""
    files = [p for d in PRODUCT for p in sorted((ROOT / d).rglob("*.py"))
             if not p.relative_to(ROOT).as_posix().startswith(NOT_PRODUCT)]
    assert any(p.relative_to(ROOT).as_posix() == "trainer/run/loop.py" for p in files), "the walk found no loop"
    return files


def long_functions(source: str, max_lines: int = MAX_LINES) -> list[str]:
    """`name (n lines)` of every function or method of `source` longer than `max_lines` (decorators excluded)."""
    return [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)" for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.end_lineno - node.lineno + 1 > max_lines]


def _is_env(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "env") or (isinstance(node, ast.Name) and node.id == "env")


def env_branches(source: str) -> list[int]:
    """Lines of `source` that compare an `env` (`trainer.env == "swe"`, `env != ...`, `tc.env in (...)`)."""
    return [node.lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Compare) and any(_is_env(x) for x in [node.left, *node.comparators])]


def test_no_product_function_is_over_80_lines():
    found = {str(p.relative_to(ROOT)): long_functions(p.read_text()) for p in product_files()}
    assert not {name: f for name, f in found.items() if f}, found


def test_no_env_branch_in_trainer():
    files = sorted(TRAINER.rglob("*.py"))
    assert len(files) > 30, [p.name for p in files]  # the rooms are walked, not only trainer/*.py
    found = {str(p.relative_to(ROOT)): env_branches(p.read_text()) for p in files}
    assert not {name: f for name, f in found.items() if f}, found
    assert not [p.name for p in files if "trainer.env ==" in p.read_text()]


def test_the_checks_fail_on_sources_that_break_them():
    body = "\n".join(f"    x = {i}" for i in range(MAX_LINES))  # 80 body lines + the def: 81
    assert long_functions(f"def long():\n{body}\n") == [f"long ({MAX_LINES + 1} lines)"]
    assert long_functions(f"class A:\n    def m(self):\n    {body.replace(chr(10), chr(10) + '    ')}\n") \
        == [f"m ({MAX_LINES + 1} lines)"]
    assert long_functions("def short():\n    return 1\n") == []
    assert env_branches("if cfg.trainer.env == 'swe':\n    pass\n") == [1]
    assert env_branches("x = 1\nok = tc.env != 'simulated'\n") == [2]
    assert env_branches("ok = 'toy' == env\n") == [1]
    assert env_branches("spec = env_spec(cfg.trainer.env)\nok = spec.preflight == True\n") == []
