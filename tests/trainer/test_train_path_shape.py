"""The train path stays readable: no function on it over 80 lines, and no `trainer.env ==` branch in
trainer/ (an env says what it needs in its spec, harness.runner.ENVS). Each check is shown to fail on a
synthetic source that breaks it."""
from __future__ import annotations

import ast
from pathlib import Path

TRAINER = Path(__file__).resolve().parents[2] / "trainer"
TRAIN_PATH = ("loop.py", "actors.py", "workers.py", "checkpoint.py")
MAX_LINES = 80


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


def test_no_function_on_the_train_path_is_over_80_lines():
    found = {name: long_functions((TRAINER / name).read_text()) for name in TRAIN_PATH}
    assert not any(found.values()), found


def test_no_env_branch_in_trainer():
    found = {p.name: env_branches(p.read_text()) for p in sorted(TRAINER.glob("*.py"))}
    assert not any(found.values()), found
    assert not [p.name for p in TRAINER.glob("*.py") if "trainer.env ==" in p.read_text()]


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
