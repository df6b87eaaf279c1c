"""Build the bundled task suite (``tasks/bundled``) from its sources (``tasks/suite``).

Run it with the project's interpreter::

    python -m tasks.suite.build_suite                 # regenerate tasks/bundled
    python -m tasks.suite.build_suite --out DIR       # somewhere else
    python -m tasks.suite.build_suite --tasks sao-harness__minicfg-8,...
    python -m tasks.suite.build_suite --check         # is tasks/bundled up to date?

Sources, per code base ``tasks/suite/<name>/``:

``codebase.yaml``
    repository name, version, authors, the commits leading to the base commit
    (``history``) and the commits after it on ``main`` (``future``);
``base/``
    the source tree at the base commit;
``history/<overlay>/``
    earlier versions of a few files, used by the history steps;
``tasks/<number>/``
    one task: ``task.yaml`` (title, difficulty, created_at),
    ``problem_statement.md``, optional ``hints.md``, ``fix.patch`` (the gold
    patch, no test files) and ``test.patch`` (tests under ``tests/`` only).

What happens, with the host's git and python and no Docker:

1. Each code base becomes a git repository with fixed authors, committers and
   dates, so the base commit hash is the same on every run.  Commits after
   the base are added too (a version bump on ``main`` and one ``fix/<n>``
   branch per task), then ``repo.bundle`` is made from a repository that
   fetched the base commit only; the build fails if the bundle holds any
   commit that is not an ancestor of the base.
2. For every task, in a scratch worktree at the base commit: the patches are
   applied and re-diffed by git (so they are normalised); the gold patch
   must touch no test file and the test patch nothing outside ``tests/``.
3. The task directory is written in swebench's task-repo layout; its eval.sh
   comes from the one template in ``templates/``.  That eval.sh then runs the
   way swebench's harness runs it (``make_test_spec(...).eval_script``, with
   ``/testbed`` pointing at the worktree and ``python3`` at ``--python``),
   once on the bare base commit and once with the gold patch applied.
   FAIL_TO_PASS / PASS_TO_PASS come from those two runs, parsed by swebench
   (``get_logs_eval`` with ``parse_log_pytest``): every test must pass with
   the gold patch, and every FAIL_TO_PASS test must be one the test patch
   adds or changes.  Both runs are then graded with ``get_eval_report``: the
   gold patch must be RESOLVED; the empty patch must not, with every
   FAIL_TO_PASS test failing and every PASS_TO_PASS test passing.
4. All gold patches of a code base must also apply together without
   breaking the code base's own test suite, so tasks do not interfere.

The output is byte-for-byte reproducible with the same git version.
"""

from __future__ import annotations

import argparse
import datetime as dt
import fnmatch
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

SUITE_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = SUITE_DIR.parent.parent
DEFAULT_OUT = PROJECT_ROOT / "tasks" / "bundled"
TEMPLATES = SUITE_DIR / "templates"

DATASET = "sao-harness/bundled"
SPLIT = "test"
LOG_PARSER = "parse_log_pytest"
EVAL_TYPE = "pass_and_fail"
DIFFICULTIES = ("easy", "medium", "hard")
TEST_DIR = "tests/"

# files that never belong to a code base's tree
_IGNORED_PARTS = {"__pycache__", ".pytest_cache", ".git"}

# git, isolated from whoever runs this: no user or system config, no hooks,
# the same output on every machine
_GIT_CONFIG = [
    "-c", "core.autocrlf=false",
    "-c", "core.abbrev=12",
    "-c", "core.hooksPath=/dev/null",
    "-c", "commit.gpgSign=false",
    "-c", "tag.gpgSign=false",
    "-c", "diff.noprefix=false",
    "-c", "diff.mnemonicPrefix=false",
    "-c", "diff.renames=false",
    "-c", "pack.threads=1",
    "-c", "init.defaultBranch=main",
    "-c", "advice.detachedHead=false",
]


class BuildError(Exception):
    """A source is malformed or a task fails its verification."""


# --------------------------------------------------------------------------
# small helpers


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Git:
    """Runs git with an isolated environment (see ``_GIT_CONFIG``)."""

    def __init__(self, home: Path):
        home.mkdir(parents=True, exist_ok=True)
        empty_config = home / "gitconfig"
        empty_config.write_text("", encoding="utf-8")
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": str(empty_config),
            "GIT_TERMINAL_PROMPT": "0",
            "LC_ALL": "C",
            "TZ": "UTC",
        }

    def __call__(self, cwd: Path, *args: str, env: dict | None = None,
                 input: str | None = None, check: bool = True) -> str:
        proc = subprocess.run(
            ["git", *_GIT_CONFIG, *args],
            cwd=cwd,
            env={**self.env, **(env or {})},
            input=input,
            capture_output=True,
            encoding="utf-8",
        )
        if check and proc.returncode != 0:
            raise BuildError(
                f"git {' '.join(args)} (in {cwd}) failed: {proc.stderr.strip() or proc.stdout.strip()}"
            )
        return proc.stdout


def _read_tree(root: Path) -> dict[str, bytes]:
    """Relative path -> bytes for every file under root."""
    files = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if _IGNORED_PARTS & set(rel.parts) or path.suffix == ".pyc":
            continue
        if path.is_file():
            files[rel.as_posix()] = path.read_bytes()
    return files


def _write_tree(root: Path, files: dict[str, bytes]) -> None:
    """Make the work tree of root (its .git aside) hold exactly ``files``."""
    for path in sorted(root.iterdir()):
        if path.name == ".git":
            continue
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    for rel, data in files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(0o644)


def _commit_env(author: dict, date: str) -> dict:
    return {
        "GIT_AUTHOR_NAME": author["name"],
        "GIT_AUTHOR_EMAIL": author["email"],
        "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_NAME": author["name"],
        "GIT_COMMITTER_EMAIL": author["email"],
        "GIT_COMMITTER_DATE": date,
    }


def _patch_paths(patch: str) -> tuple[list[str], list[str]]:
    """(paths the patch modifies or deletes, paths it creates), in patch order."""
    existing: list[str] = []
    created: list[str] = []
    path, in_header, new_file = None, False, False

    def flush():
        if path is not None:
            (created if new_file else existing).append(path)

    for line in patch.splitlines():
        if line.startswith("diff --git "):
            flush()
            path = line.split(" b/", 1)[1] if " b/" in line else line.split()[-1]
            in_header, new_file = True, False
        elif in_header and line.startswith("@@"):
            in_header = False
        elif in_header and (line.startswith("new file mode") or line == "--- /dev/null"):
            new_file = True
    flush()
    return existing, created


def _patch_test_names(patch: str) -> set[str]:
    """Names of the test functions a patch adds or changes.

    A function counts when its ``def`` line is added, or when a changed line
    lies in its body (found through the hunk's ``@@ ... def name(`` header or
    the last ``def`` seen in the hunk).
    """
    names: set[str] = set()
    current = None
    for line in patch.splitlines():
        if line.startswith("@@"):
            m = re.search(r"def (test\w*)", line)
            current = m.group(1) if m else None
            continue
        m = re.match(r"^[ +-]\s*(?:async\s+)?def (test\w*)", line)
        if m:
            current = m.group(1)
            if line.startswith("+"):
                names.add(current)
            continue
        if line[:1] in "+-" and not line.startswith(("+++", "---")) and current:
            names.add(current)
    return names


def _is_test_path(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return (
        path.startswith(TEST_DIR)
        or name.startswith("test_")
        or name.endswith("_test.py")
        or name == "conftest.py"
    )


def _render(template: str, **values: str) -> str:
    """Fill ``{{name}}`` placeholders in one pass (values are never re-scanned)."""
    names = set(re.findall(r"\{\{(\w+)\}\}", template))
    if names != set(values):
        raise BuildError(f"template placeholders {sorted(names)} != values {sorted(values)}")
    return re.sub(r"\{\{(\w+)\}\}", lambda m: values[m.group(1)], template)


# --------------------------------------------------------------------------
# sources


@dataclass
class TaskSource:
    codebase: "Codebase"
    number: int
    path: Path
    meta: dict
    problem_statement: str
    hints: str
    fix_patch: str
    test_patch: str

    @property
    def instance_id(self) -> str:
        owner, name = self.codebase.repo.split("/")
        return f"{owner}__{name}-{self.number}"


@dataclass
class Codebase:
    name: str
    path: Path
    meta: dict
    tasks: list[TaskSource] = field(default_factory=list)

    @property
    def repo(self) -> str:
        return self.meta["repo"]

    def author(self, key: str | None) -> dict:
        return self.meta["authors"][key or self.meta["maintainer"]]


def load_codebases(suite_dir: Path = SUITE_DIR) -> list[Codebase]:
    codebases = []
    for meta_path in sorted(suite_dir.glob("*/codebase.yaml")):
        root = meta_path.parent
        meta = yaml.safe_load(meta_path.read_text(encoding="utf-8"))
        for key in ("repo", "version", "authors", "maintainer", "history"):
            if key not in meta:
                raise BuildError(f"{meta_path}: no {key}")
        cb = Codebase(root.name, root, meta)
        for task_dir in sorted((root / "tasks").iterdir(), key=lambda p: int(p.name)):
            tmeta = yaml.safe_load((task_dir / "task.yaml").read_text(encoding="utf-8"))
            for key in ("title", "difficulty", "created_at"):
                if key not in tmeta:
                    raise BuildError(f"{task_dir}/task.yaml: no {key}")
            if tmeta["difficulty"] not in DIFFICULTIES:
                raise BuildError(f"{task_dir}: difficulty must be one of {DIFFICULTIES}")
            hints = task_dir / "hints.md"
            cb.tasks.append(
                TaskSource(
                    codebase=cb,
                    number=int(task_dir.name),
                    path=task_dir,
                    meta=tmeta,
                    problem_statement=(task_dir / "problem_statement.md").read_text(encoding="utf-8"),
                    hints=hints.read_text(encoding="utf-8") if hints.is_file() else "",
                    fix_patch=(task_dir / "fix.patch").read_text(encoding="utf-8"),
                    test_patch=(task_dir / "test.patch").read_text(encoding="utf-8"),
                )
            )
        codebases.append(cb)
    return codebases


# --------------------------------------------------------------------------
# repositories


@dataclass
class BuiltRepo:
    path: Path          # full repository: history, base, future commits, fix branches
    base_commit: str
    bundle: Path        # history up to the base commit only
    future_commits: list[str]


def _history_trees(cb: Codebase) -> list[dict[str, bytes]]:
    base = _read_tree(cb.path / "base")
    current: dict[str, bytes] = {}
    trees = []
    for step in cb.meta["history"]:
        for pattern in step.get("add", []):
            matched = [p for p in base if fnmatch.fnmatchcase(p, pattern)]
            if not matched:
                raise BuildError(f"{cb.name}: history pattern {pattern!r} matches nothing")
            for p in matched:
                current[p] = base[p]
        if step.get("overlay"):
            overlay = _read_tree(cb.path / "history" / step["overlay"])
            current.update(overlay)
        trees.append(dict(sorted(current.items())))
    if trees[-1] != base:
        raise BuildError(f"{cb.name}: the last history step does not reproduce base/")
    return trees


def build_repo(cb: Codebase, workdir: Path, git: Git) -> BuiltRepo:
    repo = workdir / cb.name
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")

    for step, tree in zip(cb.meta["history"], _history_trees(cb)):
        _write_tree(repo, tree)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "--allow-empty", "-m", step["message"],
            env=_commit_env(cb.author(step.get("author")), step["date"]))
    base_commit = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "tag", "-a", f"v{cb.meta['version']}.0", "-m", f"Release {cb.meta['version']}.0",
        env=_commit_env(cb.author(None), cb.meta["history"][-1]["date"]))

    future: list[str] = []
    for step in cb.meta.get("future", []):
        for edit in step["replace"]:
            target = repo / edit["path"]
            text = target.read_text(encoding="utf-8")
            if text.count(edit["old"]) != 1:
                raise BuildError(f"{cb.name}: future edit of {edit['path']} does not match once")
            target.write_text(text.replace(edit["old"], edit["new"]), encoding="utf-8")
        git(repo, "commit", "-q", "-a", "-m", step["message"],
            env=_commit_env(cb.author(step.get("author")), step["date"]))
        future.append(git(repo, "rev-parse", "HEAD").strip())

    # the fixes themselves, one branch each, as they were merged upstream
    for task in cb.tasks:
        branch = f"fix/{task.number}"
        git(repo, "checkout", "-q", "-b", branch, base_commit)
        for patch in (task.fix_patch, task.test_patch):
            git(repo, "apply", "--index", "-", input=patch)
        created = dt.datetime.fromisoformat(task.meta["created_at"].replace("Z", "+00:00"))
        date = (created + dt.timedelta(days=2, hours=3)).isoformat()
        git(repo, "commit", "-q", "-m", f"{task.meta['title']} (#{task.number})",
            env=_commit_env(cb.author(task.meta.get("author")), date))
        future.append(git(repo, "rev-parse", "HEAD").strip())
    git(repo, "checkout", "-q", "main")

    bundle = workdir / f"{cb.name}.bundle"
    export = workdir / f"{cb.name}-export"
    export.mkdir()
    git(export, "init", "-q", "--bare", "-b", "main")
    git(export, "fetch", "-q", "--no-tags", str(repo), f"{base_commit}:refs/heads/main")
    git(export, "bundle", "create", "-q", str(bundle), "HEAD", "main")
    verify_bundle(bundle, base_commit, git, workdir / f"{cb.name}-bundle-check",
                  full_repo=repo, forbidden=set(future))
    return BuiltRepo(repo, base_commit, bundle, future)


def bundle_commits(bundle: Path, git: Git, scratch: Path) -> tuple[dict[str, str], set[str]]:
    """(ref -> commit, every commit reachable in a clone of the bundle)."""
    heads = {}
    for line in git(bundle.parent, "bundle", "list-heads", str(bundle)).splitlines():
        sha, ref = line.split()
        heads[ref] = sha
    if scratch.exists():
        shutil.rmtree(scratch)
    git(bundle.parent, "clone", "-q", str(bundle), str(scratch))
    commits = set(git(scratch, "log", "--all", "--format=%H").split())
    shutil.rmtree(scratch)
    return heads, commits


def verify_bundle(bundle: Path, base_commit: str, git: Git, scratch: Path,
                  full_repo: Path, forbidden: set[str]) -> None:
    """The bundle's only head is the base commit and it holds nothing else."""
    heads, commits = bundle_commits(bundle, git, scratch)
    if set(heads.values()) != {base_commit}:
        raise BuildError(f"{bundle.name}: heads {heads} are not the base commit")
    ancestry = set(git(full_repo, "rev-list", base_commit).split())
    if base_commit not in commits or commits - ancestry:
        raise BuildError(f"{bundle.name}: commits other than the base history: "
                         f"{sorted(commits - ancestry)}")
    leaked = commits & forbidden
    if leaked:
        raise BuildError(f"{bundle.name}: future commits leaked: {sorted(leaked)}")


# --------------------------------------------------------------------------
# tasks


@dataclass
class BuiltTask:
    source: TaskSource
    base_commit: str
    gold_patch: str
    test_patch: str
    fail_to_pass: list[str]
    pass_to_pass: list[str]


def _clean(git: Git, work: Path, base_commit: str) -> None:
    git(work, "checkout", "-q", "-f", "--detach", base_commit)
    git(work, "clean", "-fdxq")


def _normalise(git: Git, work: Path, base_commit: str, patch: str, what: str) -> str:
    """Apply ``patch`` at the base commit and let git write it again."""
    _clean(git, work, base_commit)
    try:
        git(work, "apply", "--index", "-", input=patch)
    except BuildError as e:
        raise BuildError(f"{what} does not apply: {e}") from None
    out = git(work, "diff", "--cached", "--no-color", "--no-ext-diff", base_commit)
    if not out.strip():
        raise BuildError(f"{what} is empty")
    return out


def _pytest_env() -> dict:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "LC_ALL": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        # the task images have pytest and no plugins; so must the host run
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }


def run_pytest(python: str, work: Path, test_files: list[str]) -> tuple[dict[str, str], str]:
    """Run pytest like the eval script does; (status map, output)."""
    from swebench.harness.log_parsers.python import parse_log_pytest

    proc = subprocess.run(
        [python, "-m", "pytest", "-rA", "-p", "no:cacheprovider", *test_files],
        cwd=work,
        env=_pytest_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        encoding="utf-8",
        timeout=300,
    )
    return parse_log_pytest(proc.stdout, None), proc.stdout


class HostHarness:
    """Does on the host what swebench's ``run_instance`` does in a container.

    The model patch is applied with ``git apply`` in a worktree at the base
    commit, and the eval script that the harness would run -- swebench's own
    ``make_test_spec(instance).eval_script`` -- runs with ``/testbed`` pointing
    at that worktree and ``python3`` at the chosen interpreter.
    """

    def __init__(self, work: Path, git: Git, python: str, scratch: Path):
        self.work, self.git, self.scratch = work, git, scratch
        scratch.mkdir(parents=True, exist_ok=True)
        shim = scratch / "bin"
        shim.mkdir(exist_ok=True)
        # a wrapper, not a symlink: a venv's interpreter must be started by its own path
        (shim / "python3").write_text(f'#!/bin/sh\nexec "{python}" "$@"\n', encoding="utf-8")
        (shim / "python3").chmod(0o755)
        self.env = {
            **git.env,
            **_pytest_env(),
            "PATH": f"{shim}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(scratch),
            "GIT_CONFIG_GLOBAL": str(scratch / "gitconfig"),
        }

    def run(self, spec, base_commit: str, model_patch: str, label: str) -> Path:
        """Apply ``model_patch``, run the eval script; the path of the log."""
        _clean(self.git, self.work, base_commit)
        if model_patch:
            self.git(self.work, "apply", "--verbose", "-", input=model_patch)
        script = self.scratch / "eval.sh"
        script.write_text(spec.eval_script.replace("/testbed", str(self.work)), encoding="utf-8")
        proc = subprocess.run(["/bin/bash", str(script)], cwd=self.work, env=self.env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              encoding="utf-8", timeout=300)
        log = self.scratch / f"{spec.instance_id}.{label}.log"
        log.write_text(proc.stdout, encoding="utf-8")
        return log


def render_eval_script(base_commit: str, test_patch: str) -> str:
    """The task's eval.sh, from the one template every task shares."""
    existing, created = _patch_paths(test_patch)
    resets = []
    if existing:
        resets.append(f"git checkout {base_commit} -- {' '.join(existing)}")
    if created:
        resets.append(f"rm -f {' '.join(created)}")
    return _render(
        (TEMPLATES / "eval.sh.tmpl").read_text(encoding="utf-8"),
        base_commit=base_commit,
        reset_tests="\n".join(resets),
        test_patch=test_patch.rstrip("\n"),
        test_files=" ".join(p for p in existing + created if p.endswith(".py")),
    )


def render_dockerfile(base_commit: str) -> str:
    return _render((TEMPLATES / "Dockerfile.tmpl").read_text(encoding="utf-8"),
                   base_commit=base_commit)


def task_metadata(task: TaskSource, base_commit: str) -> dict:
    from swebench.task.checks import expected_image

    tid = task.instance_id
    return {
        "instance_id": tid,
        "repo": task.codebase.repo,
        "version": str(task.codebase.meta["version"]),
        "base_commit": base_commit,
        "environment_setup_commit": base_commit,
        "split": SPLIT,
        "datasets": [DATASET],
        "image": expected_image(tid),
        "log_parser": LOG_PARSER,
        "eval_type": EVAL_TYPE,
        "created_at": task.meta["created_at"],
        "difficulty": task.meta["difficulty"],
    }


def build_task(task: TaskSource, built: BuiltRepo, harness: HostHarness, git: Git,
               out_tasks: Path) -> BuiltTask:
    """Normalise, run, grade and write one task."""
    from swebench.harness.grading import get_eval_report, get_logs_eval
    from swebench.harness.utils import make_test_spec
    from swebench.task.repo import dump_tests, dump_yaml, load_task

    tid = task.instance_id
    base = built.base_commit
    work = harness.work
    gold = _normalise(git, work, base, task.fix_patch, f"{tid}: fix.patch")
    test = _normalise(git, work, base, task.test_patch, f"{tid}: test.patch")

    bad = [p for p in sum(_patch_paths(gold), []) if _is_test_path(p)]
    if bad:
        raise BuildError(f"{tid}: the gold patch touches test files: {bad}")
    bad = [p for p in sum(_patch_paths(test), []) if not p.startswith(TEST_DIR)]
    if bad:
        raise BuildError(f"{tid}: the test patch touches files outside {TEST_DIR}: {bad}")

    task_dir = out_tasks / tid
    if task_dir.exists():
        shutil.rmtree(task_dir)
    task_dir.mkdir(parents=True)
    meta = task_metadata(task, base)
    files = {
        "task.yaml": dump_yaml(meta),
        "problem_statement.md": task.problem_statement,
        "gold.patch": gold,
        "test.patch": test,
        "eval.sh": render_eval_script(base, test),
        "Dockerfile": render_dockerfile(base),
    }
    if task.hints.strip():
        files["hints.md"] = task.hints
    for name, text in files.items():
        (task_dir / name).write_text(text, encoding="utf-8")
    shutil.copyfile(built.bundle, task_dir / "repo.bundle")

    # run the eval script with no patch and with the gold patch; the tests
    # that decide the task are read from these two runs
    spec = make_test_spec({**meta, "eval_script": files["eval.sh"],
                           "FAIL_TO_PASS": [], "PASS_TO_PASS": []})
    logs = {label: harness.run(spec, base, patch, label)
            for label, patch in (("empty", ""), ("gold", gold))}
    before, found_before = get_logs_eval(spec, str(logs["empty"]))
    after, found_after = get_logs_eval(spec, str(logs["gold"]))
    if not (found_before and found_after and after):
        raise BuildError(f"{tid}: the eval script did not produce test results:\n"
                         f"{logs['gold'].read_text(encoding='utf-8')[-4000:]}")
    failing = [t for t, status in after.items() if status != "PASSED"]
    if failing:
        raise BuildError(f"{tid}: tests do not pass with the gold patch: {failing}\n"
                         f"{logs['gold'].read_text(encoding='utf-8')[-4000:]}")
    # parse_log_pytest splits lines on whitespace: an id with a space in its
    # parameters comes out truncated, with unbalanced brackets
    odd = [t for t in {**before, **after} if t.count("[") != t.count("]")]
    if odd:
        raise BuildError(f"{tid}: test ids with whitespace cannot be graded: {odd}")
    f2p = [t for t in after if before.get(t) != "PASSED"]
    p2p = [t for t in after if before.get(t) == "PASSED"]
    if not f2p:
        raise BuildError(f"{tid}: no test fails without the gold patch")
    # a FAIL_TO_PASS test must be one the test patch adds or changes, not an
    # old test that only fails because its module no longer imports
    touched = _patch_test_names(test)
    stray = [t for t in f2p if t.split("::")[-1].split("[")[0] not in touched]
    if stray:
        raise BuildError(f"{tid}: FAIL_TO_PASS tests the test patch does not touch: {stray}")
    (task_dir / "tests.json").write_text(
        dump_tests({"FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p}), encoding="utf-8")

    # grade both runs from the written task, exactly as the harness would
    spec = make_test_spec(load_task(task_dir))
    for label, patch in (("gold", gold), ("empty", "")):
        pred = {"instance_id": tid, "model_name_or_path": label, "model_patch": patch}
        report = get_eval_report(spec, pred, str(logs[label]), include_tests_status=True)[tid]
        status = report.get("tests_status", {})
        if label == "gold" and not report["resolved"]:
            raise BuildError(f"{tid}: the gold patch does not resolve the task: {report}")
        if label == "empty" and (
            report["resolved"]
            or status["FAIL_TO_PASS"]["success"]
            or status["PASS_TO_PASS"]["failure"]
        ):
            raise BuildError(f"{tid}: an empty patch grades as {report}")
    return BuiltTask(task, base, gold, test, f2p, p2p)


def check_together(cb: Codebase, built: BuiltRepo, tasks: list[BuiltTask], work: Path,
                   git: Git, python: str) -> None:
    """Every gold patch applied at once keeps the code base's own suite green."""
    _clean(git, work, built.base_commit)
    for bt in tasks:
        try:
            git(work, "apply", "-", input=bt.gold_patch)
        except BuildError as e:
            raise BuildError(f"{cb.name}: gold patches interfere at "
                             f"{bt.source.instance_id}: {e}") from None
    results, log = run_pytest(python, work, ["tests"])
    failing = [t for t, s in results.items() if s != "PASSED"]
    if not results or failing:
        raise BuildError(f"{cb.name}: with every gold patch applied, failing: {failing}\n{log}")


def check_base(cb: Codebase, built: BuiltRepo, work: Path, git: Git, python: str) -> int:
    _clean(git, work, built.base_commit)
    results, log = run_pytest(python, work, ["tests"])
    failing = [t for t, s in results.items() if s != "PASSED"]
    if not results or failing:
        raise BuildError(f"{cb.name}: the base commit's own suite fails: {failing}\n{log}")
    return len(results)


# --------------------------------------------------------------------------
# the suite


BUNDLED_README = """\
# Bundled task suite

Generated by `python -m tasks.suite.build_suite` from `tasks/suite/`; do not
edit by hand. A swebench 5.x task repo: `sweb.yaml` and one directory per
instance under `tasks/`. Each Dockerfile expects
`--build-arg BASE_IMAGE=<base image>` (Debian bookworm with python3,
python3-pytest and git) and its own directory as the build context.
"""


def write_config(out: Path) -> None:
    from swebench.task.repo import dump_yaml

    out.mkdir(parents=True, exist_ok=True)
    config = dump_yaml({"datasets": [DATASET], "splits": [SPLIT]})
    (out / "sweb.yaml").write_text(config, encoding="utf-8")
    (out / "README.md").write_text(BUNDLED_README, encoding="utf-8")
    # patches, scripts and bundles must reach the task images byte for byte
    (out / ".gitattributes").write_text(
        "*.bundle binary\n*.patch -text\n*.sh -text\nDockerfile -text\n", encoding="utf-8")


def build_suite(out: Path = DEFAULT_OUT, only: set[str] | None = None,
                python: str = sys.executable, suite_dir: Path = SUITE_DIR) -> list[dict]:
    """Regenerate the task repo at ``out``; return one summary dict per task built."""
    started = time.monotonic()
    resolved = shutil.which(python)
    if resolved is None:
        raise BuildError(f"no interpreter {python!r}")
    python = os.path.abspath(resolved)
    codebases = load_codebases(suite_dir)
    all_ids = {t.instance_id for cb in codebases for t in cb.tasks}
    if only is not None:
        unknown = only - all_ids
        if unknown:
            raise BuildError(f"unknown task ids: {sorted(unknown)}")

    summary = []
    with tempfile.TemporaryDirectory(prefix="sao-suite-") as tmp:
        tmp = Path(tmp)
        git = Git(tmp / "home")
        # everything is staged first, so a failed build leaves --out as it was
        stage = tmp / "stage"
        out_tasks = stage / "tasks"
        out_tasks.mkdir(parents=True)
        for cb in codebases:
            wanted = [t for t in cb.tasks if only is None or t.instance_id in only]
            if not wanted:
                continue
            cb_tmp = tmp / cb.name
            built = build_repo(cb, cb_tmp, git)
            work = cb_tmp / "work"
            git(built.path, "worktree", "add", "-q", "--detach", str(work), built.base_commit)
            n_tests = check_base(cb, built, work, git, python)
            _log(f"{cb.repo}: base {built.base_commit[:12]}, {n_tests} tests pass")
            harness = HostHarness(work, git, python, cb_tmp / "harness")
            built_tasks = []
            for task in wanted:
                bt = build_task(task, built, harness, git, out_tasks)
                built_tasks.append(bt)
                summary.append({
                    "instance_id": task.instance_id,
                    "difficulty": task.meta["difficulty"],
                    "title": task.meta["title"],
                    "FAIL_TO_PASS": len(bt.fail_to_pass),
                    "PASS_TO_PASS": len(bt.pass_to_pass),
                })
                _log(f"  {task.instance_id:32} {task.meta['difficulty']:6} "
                     f"F2P {len(bt.fail_to_pass):2}  P2P {len(bt.pass_to_pass):2}  "
                     f"{task.meta['title']}")
            if only is None:
                check_together(cb, built, built_tasks, work, git, python)
        _publish(stage, Path(out), full=only is None)
    _log(f"built {len(summary)} tasks in {time.monotonic() - started:.1f}s -> {out}")
    return summary


def _publish(stage: Path, out: Path, full: bool) -> None:
    """Move the staged task directories into ``out``.

    A full build replaces ``out/tasks`` (tasks that no longer exist go); a
    partial one replaces only the tasks it built.
    """
    write_config(out)
    out_tasks = out / "tasks"
    out_tasks.mkdir(exist_ok=True)
    built = {d.name for d in (stage / "tasks").iterdir()}
    for existing in sorted(out_tasks.iterdir()):
        if existing.is_dir() and (existing.name in built or full):
            shutil.rmtree(existing)
    for name in sorted(built):
        shutil.copytree(stage / "tasks" / name, out_tasks / name)


def compare_trees(expected: Path, actual: Path) -> list[str]:
    """Differences between two generated task repos (bundles compared by content)."""
    problems = []
    exp = {p.relative_to(expected).as_posix() for p in expected.rglob("*") if p.is_file()}
    act = {p.relative_to(actual).as_posix() for p in actual.rglob("*") if p.is_file()}
    for rel in sorted(exp ^ act):
        problems.append(f"only in {'expected' if rel in exp else 'actual'}: {rel}")
    with tempfile.TemporaryDirectory(prefix="sao-suite-cmp-") as tmp:
        git = Git(Path(tmp) / "home")
        for rel in sorted(exp & act):
            a, b = expected / rel, actual / rel
            if a.read_bytes() == b.read_bytes():
                continue
            if rel.endswith(".bundle"):
                ha, ca = bundle_commits(a, git, Path(tmp) / "a")
                hb, cb_ = bundle_commits(b, git, Path(tmp) / "b")
                if ha == hb and ca == cb_:
                    continue
            problems.append(f"differs: {rel}")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tasks.suite.build_suite", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="task repo to write")
    ap.add_argument("--tasks", help="comma-separated instance ids (default: all)")
    ap.add_argument("--python", default=sys.executable,
                    help="interpreter that runs the code bases' tests (needs pytest)")
    ap.add_argument("--check", action="store_true",
                    help="build into a temporary directory and compare it with --out")
    args = ap.parse_args(argv)
    only = set(args.tasks.split(",")) if args.tasks else None
    try:
        if args.check:
            with tempfile.TemporaryDirectory(prefix="sao-suite-check-") as tmp:
                build_suite(Path(tmp), only, args.python)
                if only is not None:
                    diffs = []
                    for tid in sorted(only):
                        diffs += compare_trees(args.out / "tasks" / tid, Path(tmp) / "tasks" / tid)
                else:
                    diffs = compare_trees(args.out, Path(tmp))
            for d in diffs:
                print(d)
            print("up to date" if not diffs else f"{len(diffs)} difference(s)")
            return 1 if diffs else 0
        build_suite(args.out, only, args.python)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
