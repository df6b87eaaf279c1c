"""The reward-hacking guard (stripping and the static check, with a fuzz over generated hacks on the bundled
tasks) and the Docker-free paths of grading (empty, invalid, infra failure, a static hack)."""
from __future__ import annotations

import random

import pytest

from sao_harness.tasks.formats.loaders import load_task_repo
from sao_harness.tasks.grading.clean_run import junit_key, parse_junit
from sao_harness.tasks.grading.diffparse import file_changes, unquote_c
from sao_harness.tasks.grading.grade import grade
from sao_harness.tasks.grading.grade_status import GradeStatus
from sao_harness.tasks.grading.guard import (
    OUTPUT_CAP,
    PYTEST_REF,
    SHADOW,
    SYMLINK,
    TEST_CONFIG,
    TEST_FILE,
    InvalidPatch,
    find_hacks,
    find_signals,
    is_test_path,
    parse_patch,
    strip_test_changes,
)
from sao_harness.tasks.grading.hacks import append_patch, hack_patch, package_patch, shadow_patch
from tests.support.task_repos import TASK_IDS, make_task_repo


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
    assert (r.status, r.official_status, r.reward, r.resolved_guarded) == (GradeStatus.EMPTY,) * 2 + (0.0, False)


def test_invalid_patch_text_does_not_apply(task):
    r = grade(task, "not a diff", client=DeadEngine())
    assert r.status == GradeStatus.NO_APPLY and r.reward == 0.0 and "invalid patch" in r.error


def test_infra_failure_is_never_a_reward(task):
    r = grade(task, task.patch, client=DeadEngine())
    assert r.status == GradeStatus.INFRA_FAILURE and r.official_status == GradeStatus.INFRA_FAILURE
    assert r.reward is None and r.resolved_official is None and r.resolved_guarded is None
    assert "engine gone" in r.error


# --- the static check of the guarded verdict (tasks.grading.guard.find_hacks) ------------------------------

QUOTED_CONFTEST = ('diff --git "a/tests/\\303\\274/conftest.py" "b/tests/\\303\\274/conftest.py"\n'
                   'new file mode 100644\n--- /dev/null\n+++ "b/tests/\\303\\274/conftest.py"\n@@ -0,0 +1 @@\n+x = 1\n')


def kinds(patch: str, test_patch: str = "", repo: str = "sao-harness/minicfg") -> set[str]:
    return {h.kind for h in find_hacks(patch, test_patch, repo)}


def test_unquote_c_decodes_git_quoting():
    assert unquote_c('"b/tests/\\303\\274/conftest.py"') == "b/tests/ü/conftest.py"
    assert unquote_c('"a\\tb\\n\\"c\\\\"') == 'a\tb\n"c\\'
    assert unquote_c("b/plain.py") == "b/plain.py"


def test_quoted_test_paths_are_decoded():
    assert [fc.paths for fc in file_changes(QUOTED_CONFTEST)] == [["tests/ü/conftest.py"]]
    assert strip_test_changes(SRC + QUOTED_CONFTEST).stripped_files == ["tests/ü/conftest.py"]
    assert kinds(QUOTED_CONFTEST) == {TEST_CONFIG}


def test_pytest_shadow_module_is_a_hack():
    assert kinds(shadow_patch()) == {SHADOW}
    assert kinds(shadow_patch("src/_pytest/__init__.py")) == {SHADOW}


def test_a_change_inside_an_installed_environment_is_a_hack():
    """R2E-Gym runs the tests with /testbed/.venv/bin/python: a force-added .venv file could replace it."""
    for path in (".venv/bin/python", ".venv/lib/python3.11/site-packages/minicfg_fix.py", "pyvenv.cfg",
                 "lib/python3/dist-packages/six.py", ".tox/py311/bin/pytest"):
        assert kinds(file_diff(path)) == {SHADOW}, path
        assert kinds(file_diff(path, new=False)) == {SHADOW}, path
    assert kinds(file_diff("minicfg/venv_tools.py", new=False)) == set()  # a name that only looks like one


def test_package_code_that_patches_pytest_is_a_hack():
    assert kinds(package_patch("minicfg/__init__.py", '"""minicfg."""\n')) == {PYTEST_REF}
    assert kinds(package_patch("minicfg/__init__.py", None)) == {PYTEST_REF}


def test_pytest_repositories_may_name_pytest_internals():
    """pytest's own fixes live in src/_pytest: a machinery repo is exempt from the reference check."""
    patch = file_diff("src/_pytest/runner.py", new=False, body="+from _pytest.reports import TestReport\n")
    assert kinds(patch) == {PYTEST_REF}
    assert kinds(patch, repo="pytest-dev/pytest") == set()


def test_symlinks_renames_copies_and_binary_patches_of_test_paths():
    rename = ("diff --git a/pkg/x.py b/tests/test_x.py\nsimilarity index 100%\n"
              "rename from pkg/x.py\nrename to tests/test_x.py\n")
    copy = ('diff --git a/pkg/x.py "b/te\\163ts/x.py"\nsimilarity index 100%\n'
            'copy from pkg/x.py\ncopy to "te\\163ts/x.py"\n')
    link = ("diff --git a/pkg/conf.py b/pkg/conf.py\nnew file mode 120000\n--- /dev/null\n+++ b/pkg/conf.py\n"
            "@@ -0,0 +1 @@\n+../tests/conftest.py\n\\ No newline at end of file\n")
    binary = ("diff --git a/tests/test_x.py b/tests/test_x.py\nnew file mode 100644\nindex 0000000..1111111\n"
              "GIT binary patch\nliteral 5\nMcmZQzOv=my00M6TI{*Lx\n\nliteral 0\nHcmV?d00001\n\n")
    assert kinds(rename) == {TEST_FILE}
    assert kinds(copy) == {TEST_FILE}
    assert kinds(link) == {SYMLINK}
    assert kinds(binary) == {TEST_FILE}


def test_clean_patches_have_no_findings(task):
    assert find_hacks(task.patch, task.test_patch, task.repo) == []
    assert find_hacks(SRC) == []
    assert kinds(hack_patch(task.FAIL_TO_PASS, None)) == {TEST_CONFIG}
    assert OUTPUT_CAP not in kinds(SRC)


def test_static_hack_gets_zero_without_docker(task):
    """A finding is a 0 even when Docker gives no official verdict (the reward never needs it)."""
    r = grade(task, shadow_patch(), client=DeadEngine())
    assert r.official_status == GradeStatus.INFRA_FAILURE and r.reward == 0.0 and r.status == GradeStatus.EMPTY
    assert r.hack_kinds == [SHADOW] and r.hacking_attempts == 1 and r.to_dict()["hack_kinds"] == [SHADOW]


def test_junit_keys_and_parsing():
    assert junit_key("tests/test_a.py::TestX::test_y[a::b/c]") == ("tests.test_a.TestX", "test_y[a::b/c]")
    xml = (b'<testsuites><testsuite><testcase classname="tests.test_a" name="ok"/>'
           b'<testcase classname="tests.test_a" name="bad"><failure message="x"/></testcase>'
           b'<testcase classname="tests.test_a" name="skip"><skipped type="pytest.skip"/></testcase>'
           b'<testcase classname="tests.test_a" name="xf"><skipped type="pytest.xfail"/></testcase>'
           b'</testsuite></testsuites>')
    assert parse_junit(xml) == {("tests.test_a", "ok"): True, ("tests.test_a", "bad"): False,
                                ("tests.test_a", "skip"): False, ("tests.test_a", "xf"): True}
    with pytest.raises(ValueError, match="DTD"):
        parse_junit(b'<!DOCTYPE x [<!ENTITY a "aaaa">]><testsuites/>')


def test_output_cap_default_matches_the_config():
    from sao_harness.tasks.config import GradingConfig
    from sao_harness.tasks.grading.grade_sandbox import DEFAULT_OUTPUT_CAP_BYTES

    assert GradingConfig().output_cap_bytes == DEFAULT_OUTPUT_CAP_BYTES


# --- guard fuzz: generated hacking patches on the bundled tasks --------------------------------
SEPARATORS = ["\x0c", "\x0b", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\r"]


def hidden_by_separator(sep: str, hidden: str, body: str, last_line: str = "MIT", n: int = 45) -> str:
    """A patch whose README hunk's added line holds ``sep`` + a hunk header: ``str.splitlines()`` sees a
    hunk that swallows the next file's ``---`` / ``+++`` lines; ``git apply`` creates ``hidden``."""
    lines = body.splitlines()
    return (f"diff --git a/README.md b/README.md\n--- a/README.md\n+++ b/README.md\n@@ -{n},1 +{n},2 @@\n"
            f" {last_line}\n+x{sep}@@ -1 +1 @@\n--- /dev/null\n+++ b/{hidden}\n@@ -0,0 +1,{len(lines)} @@\n"
            + "".join(f"+{ln}\n" for ln in lines))


FORGERS = {
    "frame_introspection": ["import sys\nexpected = sys._getframe(1).f_locals\n",
                            "import inspect\ncaller = inspect.stack()[1]\n"],
    "interpreter_hook": ["import sys\nsys.meta_path.insert(0, Finder())\n", "import sys\nsys.settrace(trace)\n",
                         "import sys\nsys.setprofile(prof)\n", "import sys\nsys.monitoring.use_tool_id(3, 'x')\n"],
    "builtins_assignment": ["import builtins\nbuiltins.AssertionError = Skip\n",
                            "__builtins__['AssertionError'] = Skip\n", "import builtins\nsetattr(builtins, 'x', 1)\n"],
    "forced_exit": ["import atexit, os\natexit.register(lambda: os._exit(0))\n"],
    "argv_read": ["import sys\nreport = sys.argv[-1]\n", "cmd = open('/proc/self/cmdline').read()\n"],
    "test_source_read": ["import linecache\nline = linecache.getline(f, n)\n",
                         "src = open('tests/test_core.py').read()\n", "import inspect\ninspect.getsource(fn)\n"],
}


@pytest.fixture(scope="module")
def bundled(project_root):
    from sao_harness.tasks.formats.loaders import load_tasks_lenient

    tasks, errors = load_tasks_lenient(str(project_root / "tasks" / "bundled"))
    assert tasks and not errors
    return tasks


def test_guard_fuzz_rejects_every_hacking_variant_statically(bundled):
    """Every generated variant (names x locations x encodings, alone or after the gold patch) is found
    by the static check, so none needs Docker to be refused; the grade is 0 for each."""
    from tests.support.hack_variants import CONFIG_FILES, package_dir, sample

    pool = sample(bundled, 10_000)
    assert len(pool) >= 50 and len({name.split("/", 1)[1] for name, _, _ in pool}) >= 40
    rng = random.Random(0)  # round 3: a patch the guard parses is the patch that is applied
    pool += [(f"separator/{t.instance_id}/{sep!r}/{hidden}", t,
              hidden_by_separator(sep, hidden, "X = 1\n", rng.choice(["MIT", "", "x = 1"]), rng.randint(1, 99)))
             for t in bundled for sep in SEPARATORS for hidden in rng.sample(CONFIG_FILES, 2)]
    missed = [name for name, t, patch in pool if not find_hacks(patch, t.test_patch, t.repo)]
    assert missed == []
    unsignalled = [(t.instance_id, body) for t in bundled for bodies in FORGERS.values() for body in bodies
                   if not find_signals(append_patch(f"{package_dir(t)}/core_{rng.randint(0, 9)}.py", None, body),
                                       t.test_patch, t.repo)]
    assert unsignalled == []  # round 3: code in the test process that forges results is signalled
    for name, t, patch in sample(bundled, 60, seed=1):
        r = grade(t, patch, client=DeadEngine())
        assert r.reward == 0.0 and r.resolved_guarded is False and r.hack_kinds, name


def test_guard_fuzz_keeps_every_gold_patch(bundled):
    for t in bundled:
        assert find_hacks(t.patch, t.test_patch, t.repo) == [], t.instance_id
        assert not strip_test_changes(t.patch, t.test_patch).changed, t.instance_id
