"""Generate a tiny swebench 5.x task repository on the fly (no dependency on tasks/bundled).

``make_task_repo(root)`` writes ``root/sweb.yaml`` and ``root/tasks/<id>/{task.yaml, tests.json,
problem_statement.md, gold.patch, test.patch, eval.sh, Dockerfile, repo.bundle}`` for two tasks on
one small Python package (``calc``) whose git history has a base commit with two bugs and a later
fix commit (which must never reach an image: the bundle holds history up to the base only).
Everything is deterministic (fixed commit dates), so image recipe hashes are stable across runs.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import yaml

DATASET = "sao-test/generated"
TASK_IDS = ("sao-test__calc-1", "sao-test__calc-2")

BASE_FILES = {
    "pytest.ini": "[pytest]\n",
    "calc/__init__.py": "from calc.ops import add, mul, sub\n\n__all__ = ['add', 'mul', 'sub']\n",
    "calc/ops.py": (
        '"""Arithmetic."""\n\n\n'
        "def add(a, b):\n    return a - b\n\n\n"
        "def sub(a, b):\n    return a + b\n\n\n"
        "def mul(a, b):\n    return a * b\n"),
    "tests/__init__.py": "",
    "tests/test_ops.py": "from calc import mul\n\n\ndef test_mul():\n    assert mul(3, 4) == 12\n",
    "README.md": "calc: a tiny package for sao-harness tests\n",
}

# per task: (fixed source, new test function, problem statement)
TASKS = {
    "sao-test__calc-1": (
        ("def add(a, b):\n    return a - b\n", "def add(a, b):\n    return a + b\n"),
        "\n\ndef test_add():\n    assert add(2, 3) == 5\n", "add", "`calc.add(2, 3)` returns -1; it should return 5."),
    "sao-test__calc-2": (
        ("def sub(a, b):\n    return a + b\n", "def sub(a, b):\n    return a - b\n"),
        "\n\ndef test_sub():\n    assert sub(5, 3) == 2\n", "sub", "`calc.sub(5, 3)` returns 8; it should return 2."),
}

DOCKERFILE = """ARG BASE_IMAGE
FROM ${{BASE_IMAGE}}
COPY repo.bundle /tmp/repo.bundle
RUN git clone -q /tmp/repo.bundle /testbed && cd /testbed && git checkout -q {base} \\
    && git remote remove origin && git reflog expire --expire=now --all && rm /tmp/repo.bundle
WORKDIR /testbed
"""

EVAL = """#!/bin/bash
set -uxo pipefail
cd /testbed
git checkout {base} -- tests/test_ops.py
git apply -v - <<'EOF_SAO_TEST_PATCH'
{test_patch}EOF_SAO_TEST_PATCH
: '>>>>> Start Test Output'
python3 -m pytest -rA -p no:cacheprovider tests/test_ops.py
: '>>>>> End Test Output'
git checkout {base} -- tests/test_ops.py
"""

GIT_ENV = {"GIT_AUTHOR_NAME": "sao", "GIT_AUTHOR_EMAIL": "sao@localhost", "GIT_COMMITTER_NAME": "sao",
           "GIT_COMMITTER_EMAIL": "sao@localhost", "GIT_AUTHOR_DATE": "2024-01-01T00:00:00+00:00",
           "GIT_COMMITTER_DATE": "2024-01-01T00:00:00+00:00", "GIT_CONFIG_GLOBAL": "/dev/null",
           "GIT_CONFIG_NOSYSTEM": "1"}


def _git(cwd: Path, *args: str) -> str:
    env = dict(os.environ, **GIT_ENV)
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def make_source_repo(path: Path) -> tuple[str, dict[str, tuple[str, str]]]:
    """The package's git repo; returns (base commit, {task id: (gold patch, test patch)})."""
    path.mkdir(parents=True)
    _git(path, "init", "-q", "-b", "main")
    _write(path, BASE_FILES)
    _git(path, "add", "-A")
    _git(path, "commit", "-q", "-m", "calc with two bugs")
    base = _git(path, "rev-parse", "HEAD").strip()
    patches = {}
    for iid, ((old, new), test_fn, name, _) in TASKS.items():
        _git(path, "checkout", "-q", "-b", f"fix-{name}", base)
        ops = path / "calc/ops.py"
        ops.write_text(ops.read_text().replace(old, new))
        tests = path / "tests/test_ops.py"
        tests.write_text(tests.read_text().replace("from calc import mul", f"from calc import {name}, mul") + test_fn)
        _git(path, "commit", "-q", "-am", f"fix {name}")
        gold = _git(path, "diff", base, "HEAD", "--", "calc")
        test = _git(path, "diff", base, "HEAD", "--", "tests")
        patches[iid] = (gold, test)
        _git(path, "checkout", "-q", "main")
    # a future commit on main too: it must not be reachable inside any image
    (path / "README.md").write_text("calc, later\n")
    _git(path, "commit", "-q", "-am", "future commit")
    return base, patches


def make_task_repo(root: Path, task_ids: tuple[str, ...] = TASK_IDS) -> Path:
    """Write the task repository under ``root`` (see module doc); return ``root``."""
    from swebench.task.checks import expected_image

    root = Path(root)
    src = root.parent / f".{root.name}-src"
    if src.exists():
        shutil.rmtree(src)
    base, patches = make_source_repo(src)
    _git(src, "branch", "-q", "base", base)
    bundle = root.parent / f".{root.name}-repo.bundle"
    _git(src, "bundle", "create", "-q", str(bundle), "base")
    (root / "tasks").mkdir(parents=True, exist_ok=True)
    (root / "sweb.yaml").write_text(yaml.safe_dump({"datasets": [DATASET], "splits": ["test"]}))
    for iid in task_ids:
        (_, _), _, name, statement = TASKS[iid]
        gold, test = patches[iid]
        d = root / "tasks" / iid
        d.mkdir(parents=True, exist_ok=True)
        meta = {"instance_id": iid, "repo": "sao-test/calc", "version": "0.1", "base_commit": base,
                "split": "test", "datasets": [DATASET], "image": expected_image(iid),
                "log_parser": "parse_log_pytest", "eval_type": "pass_and_fail",
                "created_at": "2024-01-01T00:00:00Z", "difficulty": "easy"}
        (d / "task.yaml").write_text(yaml.safe_dump(meta, sort_keys=True))
        (d / "tests.json").write_text(json.dumps({"FAIL_TO_PASS": [f"tests/test_ops.py::test_{name}"],
                                                  "PASS_TO_PASS": ["tests/test_ops.py::test_mul"]}, indent=2) + "\n")
        (d / "problem_statement.md").write_text(statement + "\n")
        (d / "gold.patch").write_text(gold)
        (d / "test.patch").write_text(test)
        (d / "eval.sh").write_text(EVAL.format(base=base, test_patch=test))
        (d / "Dockerfile").write_text(DOCKERFILE.format(base=base))
        shutil.copyfile(bundle, d / "repo.bundle")
    shutil.rmtree(src)
    bundle.unlink()
    return root


def prediction(iid: str, patch: str, model: str = "test-model") -> dict:
    return {"instance_id": iid, "model_name_or_path": model, "model_patch": patch}


def unapplicable_patch() -> str:
    """A well-formed patch that modifies a file the repository does not have."""
    return ("diff --git a/calc/divide.py b/calc/divide.py\n--- a/calc/divide.py\n+++ b/calc/divide.py\n"
            "@@ -1,2 +1,2 @@\n def divide(a, b):\n-    return a * b\n+    return a / b\n")
