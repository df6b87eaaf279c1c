"""The bundled task suite (tasks/bundled) and its generator (tasks/suite), without Docker."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT
from swebench.harness.utils import make_test_spec
from swebench.task.checks import check_task_repo, errors, expected_image
from swebench.task.repo import load_config, load_task_repo, task_paths

from sao_harness.tasks.suite import build_suite as gen

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "tasks" / "bundled"
HEX40 = re.compile(r"^[0-9a-f]{40}$")

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(cwd: Path, *args: str, env: dict | None = None) -> str:
    base_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(cwd),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "LC_ALL": "C",
    }
    return subprocess.run(
        ["git", *args], cwd=cwd, env={**base_env, **(env or {})},
        capture_output=True, text=True, check=True,
    ).stdout


@pytest.fixture(scope="module")
def instances() -> list[dict]:
    return load_task_repo(BUNDLED)


@pytest.fixture(scope="module")
def dirs() -> dict[str, Path]:
    return task_paths(BUNDLED)


@pytest.fixture(scope="module")
def by_repo(instances) -> dict[str, list[dict]]:
    grouped: dict[str, list[dict]] = {}
    for inst in instances:
        grouped.setdefault(inst["repo"], []).append(inst)
    return grouped


# -- the task repo as swebench sees it -------------------------------------


def test_task_repo_is_well_formed():
    problems = check_task_repo(BUNDLED)
    assert errors(problems) == [], "\n".join(map(str, problems))
    assert load_config(BUNDLED) == {"datasets": ["sao-harness/bundled"], "splits": ["test"]}


def test_suite_size(instances, by_repo):
    assert len(instances) >= 16
    assert len(by_repo) >= 4
    assert all(len(tasks) >= 4 for tasks in by_repo.values()), {
        repo: len(tasks) for repo, tasks in by_repo.items()
    }


def test_difficulty_spread(instances):
    counts = Counter(inst["difficulty"] for inst in instances)
    assert set(counts) == {"easy", "medium", "hard"}
    assert min(counts.values()) >= 3, counts


def test_task_metadata(instances, by_repo):
    for inst in instances:
        tid = inst["instance_id"]
        owner, name = inst["repo"].split("/")
        assert re.fullmatch(rf"{re.escape(owner)}__{re.escape(name)}-\d+", tid)
        assert inst["image"] == expected_image(tid)
        assert inst["image"].startswith("swebench/sweb.eval.x86_64.sao-harness_1776_")
        assert HEX40.match(inst["base_commit"])
        assert inst["environment_setup_commit"] == inst["base_commit"]
        assert inst["split"] == "test"
        assert inst["datasets"] == ["sao-harness/bundled"]
        assert inst["log_parser"] == "parse_log_pytest"
        assert inst["eval_type"] == "pass_and_fail"
        assert isinstance(inst["version"], str) and isinstance(inst["created_at"], str)
        assert inst["problem_statement"].strip()
    for repo, tasks in by_repo.items():  # one base commit per code base
        assert len({t["base_commit"] for t in tasks}) == 1, repo


def test_test_lists(instances):
    for inst in instances:
        f2p, p2p = inst["FAIL_TO_PASS"], inst["PASS_TO_PASS"]
        assert f2p, inst["instance_id"]
        assert len(set(f2p)) == len(f2p) and len(set(p2p)) == len(p2p)
        assert not set(f2p) & set(p2p)
        test_files = set(sum(gen._patch_paths(inst["test_patch"]), []))
        for test in f2p + p2p:
            assert re.fullmatch(r"tests/\S+\.py::\S+", test), test
            assert test.count("[") == test.count("]"), test  # not cut at a space
            assert test.split("::")[0] in test_files, (inst["instance_id"], test)
    assert sum(len(inst["PASS_TO_PASS"]) for inst in instances) >= 10 * len(instances)


def test_patches(instances):
    for inst in instances:
        gold = sum(gen._patch_paths(inst["patch"]), [])
        tests = sum(gen._patch_paths(inst["test_patch"]), [])
        assert gold and tests
        assert not any(gen._is_test_path(p) for p in gold), (inst["instance_id"], gold)
        assert all(p.startswith("tests/") for p in tests), (inst["instance_id"], tests)
        assert "diff --git" in inst["patch"] and "diff --git" in inst["test_patch"]


def test_problem_statements_do_not_quote_the_fix(instances):
    for inst in instances:
        statement = inst["problem_statement"]
        added, in_code = [], False
        for line in inst["patch"].splitlines():
            if line.startswith("diff --git "):
                in_code = line.endswith(".py")
            elif in_code and line.startswith("+") and not line.startswith("+++"):
                added.append(line[1:].strip())
        leaked = [line for line in added if len(line) > 30 and line in statement]
        assert not leaked, (inst["instance_id"], leaked)


# -- Dockerfiles and eval scripts -------------------------------------------


def test_dockerfiles(instances, dirs):
    for inst in instances:
        text = (dirs[inst["instance_id"]] / "Dockerfile").read_text()
        lines = [line for line in text.splitlines() if line.strip()]
        assert lines[:2] == ["ARG BASE_IMAGE", "FROM ${BASE_IMAGE}"]
        assert "COPY repo.bundle " in text
        assert "STOPSIGNAL SIGKILL" in lines and "WORKDIR /testbed" in lines
        assert "git remote remove origin" in text
        assert "git reflog expire --expire=now --all" in text
        assert "git gc --prune=now" in text
        assert "rm -f /tmp/repo.bundle" in text
        assert f"checkout -q -B main {inst['base_commit']}" in text
        # the classic builder: no heredocs, no BuildKit mounts, no network fetches
        assert "<<" not in text and "--mount" not in text
        assert not re.search(r"\b(curl|wget|pip|apt-get)\b", text)
        assert (dirs[inst["instance_id"]] / "repo.bundle").is_file()


def test_eval_scripts(instances):
    for inst in instances:
        script = inst["eval_script"]
        assert script.startswith("#!/bin/bash\nset -uxo pipefail\n")
        start, end = script.index(START_TEST_OUTPUT), script.index(END_TEST_OUTPUT)
        assert start < end
        assert "cd /testbed" in script[:start]
        body = inst["test_patch"].rstrip("\n")
        heredoc = f"git apply -v - <<'EOF_114329324912'\n{body}\nEOF_114329324912\n"
        assert heredoc in script[:start]
        existing, created = gen._patch_paths(inst["test_patch"])
        files = [p for p in existing + created if p.endswith(".py")]
        run_line = script[start:end].splitlines()[1]
        assert run_line == "python3 -m pytest -rA -p no:cacheprovider " + " ".join(files)
        if existing:  # test files are reset before and after the run
            reset = f"git checkout {inst['base_commit']} -- {' '.join(existing)}"
            assert script.count(reset) == 2
        if created:
            assert script.count(f"rm -f {' '.join(created)}") == 2
        # the harness records the test command's own exit status
        spec_lines = make_test_spec(inst).eval_script.splitlines()
        i = next(k for k, line in enumerate(spec_lines) if END_TEST_OUTPUT in line)
        assert spec_lines[i - 1] == "SWEBENCH_TEST_EXIT_CODE=$?"
        assert spec_lines[i - 2] == run_line


def test_one_template_for_all_eval_scripts(instances):
    for inst in instances:
        expected = gen.render_eval_script(inst["base_commit"], inst["test_patch"])
        assert inst["eval_script"] == expected, inst["instance_id"]


# -- history: bundles hold the base commit and its ancestors, nothing else ----


def _bundles(instances, dirs) -> dict[str, tuple[Path, str]]:
    """One bundle per repo (all tasks of a repo ship the same bytes)."""
    out: dict[str, tuple[Path, str]] = {}
    for inst in instances:
        bundle = dirs[inst["instance_id"]] / "repo.bundle"
        if inst["repo"] in out:
            assert bundle.read_bytes() == out[inst["repo"]][0].read_bytes()
        else:
            out[inst["repo"]] = (bundle, inst["base_commit"])
    return out


def test_bundles_hold_history_up_to_base_only(instances, dirs, tmp_path):
    for repo, (bundle, base) in _bundles(instances, dirs).items():
        assert bundle.stat().st_size < 200_000, repo
        heads = git(tmp_path, "bundle", "list-heads", str(bundle)).split("\n")
        heads = [line.split() for line in heads if line]
        assert {sha for sha, _ in heads} == {base}, (repo, heads)
        assert {ref for _, ref in heads} <= {"HEAD", "refs/heads/main"}
        clone = tmp_path / repo.replace("/", "_")
        git(tmp_path, "clone", "-q", str(bundle), str(clone))
        assert git(clone, "rev-parse", "HEAD").strip() == base
        everything = git(clone, "log", "--all", "--format=%H").split()
        ancestors = git(clone, "rev-list", base).split()
        assert set(everything) == set(ancestors), repo
        assert len(ancestors) >= 3, "a few commits of history"
        assert git(clone, "tag", "-l") == ""
        dates = git(clone, "log", "--format=%cI").split()
        first_task = min(t["created_at"] for t in instances if t["repo"] == repo)
        assert max(dates) < first_task.replace("Z", "+00:00"), repo


def test_dockerfile_steps_on_the_host(instances, dirs, tmp_path):
    """Run each code base's Dockerfile RUN step against a copy of its bundle."""
    done = set()
    for inst in instances:
        if inst["repo"] in done:
            continue
        done.add(inst["repo"])
        task_dir = dirs[inst["instance_id"]]
        dockerfile = (task_dir / "Dockerfile").read_text()
        run = re.search(r"^RUN (.*?)(?<!\\)$", dockerfile, flags=re.M | re.S).group(1)
        root = tmp_path / inst["instance_id"]
        (root / "tmp").mkdir(parents=True)
        shutil.copy(task_dir / "repo.bundle", root / "tmp" / "repo.bundle")
        run = run.replace("/tmp/repo.bundle", str(root / "tmp" / "repo.bundle"))
        run = run.replace("/testbed", str(root / "testbed"))
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(root),
            "GIT_CONFIG_SYSTEM": str(root / "gitconfig"),
            "GIT_CONFIG_GLOBAL": os.devnull,
        }
        subprocess.run(["/bin/bash", "-euo", "pipefail", "-c", run], cwd=root, env=env,
                       check=True, capture_output=True, text=True)
        testbed = root / "testbed"
        genv = {"GIT_CONFIG_SYSTEM": str(root / "gitconfig"), "GIT_CONFIG_NOSYSTEM": "0"}
        assert not (root / "tmp" / "repo.bundle").exists()
        assert git(testbed, "rev-parse", "HEAD", env=genv).strip() == inst["base_commit"]
        assert git(testbed, "remote", env=genv) == ""
        assert git(testbed, "tag", "-l", env=genv) == ""
        assert git(testbed, "reflog", "--all", env=genv) == ""
        assert git(testbed, "status", "--porcelain", env=genv) == ""
        assert git(testbed, "config", "user.name", env=genv).strip()
        refs = git(testbed, "for-each-ref", "--format=%(refname)", env=genv).split()
        assert refs == ["refs/heads/main"]


# -- the generator ------------------------------------------------------------


def test_sources_match_the_generated_suite(instances):
    codebases = gen.load_codebases()
    ids = {t.instance_id: t for cb in codebases for t in cb.tasks}
    assert set(ids) == {inst["instance_id"] for inst in instances}
    for inst in instances:
        src = ids[inst["instance_id"]]
        assert src.problem_statement == inst["problem_statement"]
        assert src.meta["difficulty"] == inst["difficulty"]


@pytest.mark.slow
def test_regeneration_is_deterministic(tmp_path, dirs):
    """Rebuild one task per code base: same base commit, lists, patches, scripts.

    This also re-verifies those tasks end to end on the host: the gold patch
    resolves them and an empty patch does not, graded by swebench.
    """
    picked = {}
    for tid in sorted(dirs):
        picked.setdefault(tid.split("-")[-2], tid)
    chosen = sorted(picked.values())
    gen.build_suite(tmp_path, only=set(chosen))
    assert sorted(p.name for p in (tmp_path / "tasks").iterdir()) == chosen
    for tid in chosen:
        # text files byte for byte; bundles by their heads and commits
        assert gen.compare_trees(dirs[tid], tmp_path / "tasks" / tid) == [], tid
