"""The reward-hacking guard and the Docker-free paths of grading (empty, invalid, infra failure)."""
from __future__ import annotations

import pytest

from tasks.grade import EMPTY, INFRA, NO_APPLY, grade
from tasks.guard import InvalidPatch, is_test_path, parse_patch, strip_test_changes
from tasks.loaders import load_task_repo
from tasks_fixtures import TASK_IDS, make_task_repo


def file_diff(path: str, new: bool = True, body: str = "+x = 1\n") -> str:
    if new:
        return f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n{body}"
    return f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-x = 0\n{body}"


SRC = file_diff("pkg/core.py", new=False)
PYPROJECT = """diff --git a/pyproject.toml b/pyproject.toml
--- a/pyproject.toml
+++ b/pyproject.toml
@@ -1,3 +1,3 @@
 [project]
-name = "a"
+name = "b"
 version = "1"
@@ -10,3 +10,4 @@
 [tool.pytest.ini_options]
 x = 1
+addopts = "-p hack"
 y = 2
"""


@pytest.mark.parametrize("path", ["conftest.py", "pkg/sub/conftest.py", "pytest.ini", "tox.ini", "sitecustomize.py",
                                  "evil.pth", "tests/helpers.py", "pkg/test/data.json", "testing/x.py",
                                  "pkg/test_core.py", "pkg/core_test.py"])
def test_test_paths_are_recognised(path):
    assert is_test_path(path)


@pytest.mark.parametrize("path", ["pkg/core.py", "README.md", "setup.py", "pkg/contest.py", "latest/x.py"])
def test_source_paths_are_kept(path):
    assert not is_test_path(path)


def test_strip_removes_hacks_and_keeps_source():
    patch = SRC + file_diff("conftest.py") + file_diff("tests/test_core.py") + file_diff("tox.ini") + PYPROJECT
    r = strip_test_changes(patch)
    assert r.stripped_files == ["conftest.py", "tests/test_core.py", "tox.ini", "pyproject.toml (1 pytest-config hunk)"]
    assert r.hacking_attempts == 4
    kept = {pf.path for pf in parse_patch(r.patch)}
    assert kept == {"pkg/core.py", "pyproject.toml"}
    assert "addopts" not in r.patch and 'name = "b"' in r.patch and "x = 0" in r.patch


def test_files_touched_by_the_test_patch_are_stripped():
    test_patch = file_diff("pkg/fixtures.json", new=False)
    r = strip_test_changes(SRC + file_diff("pkg/fixtures.json", new=False, body="+{}\n"), test_patch)
    assert r.stripped_files == ["pkg/fixtures.json"]


def test_clean_patch_passes_through_unchanged():
    r = strip_test_changes(SRC)
    assert r.patch == SRC and not r.changed and r.hacking_attempts == 0


def test_only_hack_leaves_empty_patch():
    r = strip_test_changes(file_diff("conftest.py"))
    assert r.patch == "" and r.hacking_attempts == 1


def test_invalid_patch_text():
    with pytest.raises(InvalidPatch, match="no file changes"):
        strip_test_changes("I fixed it, trust me")


# --- grading paths that never reach Docker -----------------------------------------------------
@pytest.fixture(scope="module")
def task(tmp_path_factory):
    repo = make_task_repo(tmp_path_factory.mktemp("guard") / "repo", task_ids=TASK_IDS[:1])
    return load_task_repo(repo)[0]


class DeadEngine:
    """A client whose engine is gone: every call raises docker's APIError."""

    class images:  # noqa: N801
        @staticmethod
        def get(name):
            import docker

            raise docker.errors.APIError("engine gone")


def test_empty_patch_is_empty_with_reward_zero(task):
    r = grade(task, "   \n", client=DeadEngine())
    assert (r.status, r.official_status, r.reward, r.resolved_guarded) == (EMPTY, EMPTY, 0.0, False)


def test_invalid_patch_text_does_not_apply(task):
    r = grade(task, "not a diff", client=DeadEngine())
    assert r.status == NO_APPLY and r.reward == 0.0 and "invalid patch" in r.error


def test_infra_failure_is_never_a_reward(task):
    r = grade(task, task.patch, client=DeadEngine())
    assert r.status == INFRA and r.official_status == INFRA
    assert r.reward is None and r.resolved_official is None and r.resolved_guarded is None
    assert "engine gone" in r.error
