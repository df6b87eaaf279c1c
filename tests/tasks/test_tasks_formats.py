"""Every public SWE training format loads as a gradable task (real rows, tests/tasks/fixtures/datasets/),
the generated eval scripts run and grade through swebench's own parser and report, and
`sao rollout | train | eval` stop before the first episode on tasks that cannot be used."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sao_harness.core.errors import UserError
from sao_harness.tasks.formats.adapters import R2E_EPISODE_SETUP, R2E_TEST_CMD, detect, r2e_statuses
from sao_harness.tasks.formats.loaders import load_tasks, load_tasks_lenient
from sao_harness.tasks.model import TaskError
from sao_harness.tasks.preflight import usable_tasks
from tests.support.task_repos import TASK_IDS, make_task_repo

FIXTURES = Path(__file__).parent / "fixtures" / "datasets"


def rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines()]


# --- each format: adapter, image name, tests, test command --------------------------------------
@pytest.mark.parametrize("fixture, adapter, instance_id, image, n_f2p, n_p2p, command", [
    ("swebench_verified.jsonl", "swebench", "astropy__astropy-12907",
     "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest", 2, 13,
     "pytest -rA astropy/modeling/tests/test_separable.py"),
    ("swe_gym.jsonl", "swe-gym", "getmoto__moto-7365", "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-7365", 1, 1,
     "pytest -n0 -rA tests/test_dynamodb/test_dynamodb_update_expressions.py"),  # = SWE-Gym's own test_script
    ("swe_smith.jsonl", "swe-smith", "pandas-dev__pandas.95280573.pr_53652",
     "jyangballin/swesmith.x86_64.pandas-dev_1776_pandas.95280573", 2, 9,
     "pytest --disable-warnings --color=no --tb=no --verbose -rA pandas/tests/indexing/test_datetime.py"),
    ("r2e_gym.jsonl", "r2e-gym", "aiohttp__f0d74880deec",
     "namanjain12/aiohttp_final:f0d74880deec8fcd982bce639c93c5e130d41198", 63, 0, R2E_TEST_CMD),
    ("swe_rebench.jsonl", "swe-rebench", "0b01001001__spectree-64",
     "swerebench/sweb.eval.x86_64.0b01001001_1776_spectree-64", 1, 6,
     "pytest --no-header -rA --tb=no -p no:cacheprovider"),
])
def test_each_format_loads_as_a_gradable_task(fixture, adapter, instance_id, image, n_f2p, n_p2p, command):
    assert detect(rows(fixture)[0]) == adapter
    t = load_tasks(str(FIXTURES / fixture))[0]  # tasks.adapter=auto
    assert (t.adapter, t.instance_id, t.image) == (adapter, instance_id, image)
    assert t.gradable, t.grading_gaps()
    assert (len(t.FAIL_TO_PASS), len(t.PASS_TO_PASS)) == (n_f2p, n_p2p)
    spec = t.test_spec()  # swebench's own TestSpec: the script grading runs
    lines = spec.eval_script.splitlines()
    assert command in lines and lines.index(command) > lines.index(": '>>>>> Start Test Output'")
    assert spec.log_parser == t.log_parser and spec.eval_type == "pass_and_fail"


def test_swebench_rows_are_passed_through_and_classic_ones_say_why_not():
    (row,) = rows("swebench_verified.jsonl")
    assert len(row) == 17
    t = load_tasks(str(FIXTURES / "swebench_verified.jsonl"))[0]
    assert t.eval_script == row["eval_script"] and t.log_parser == "parse_log_astropy"
    (classic,) = load_tasks(str(FIXTURES / "swebench_classic.jsonl"))
    assert classic.image == t.image and not classic.gradable
    with pytest.raises(TaskError, match=r"^task astropy__astropy-12907: field 'eval_script': not gradable here: "
                                        r"no eval_script \(a classic SWE-bench row"):
        classic.require_gradable()


def test_swe_gym_script_resets_and_applies_the_test_patch():
    (row,) = rows("swe_gym.jsonl")
    script = load_tasks(str(FIXTURES / "swe_gym.jsonl"))[0].eval_script
    reset = f"git checkout {row['base_commit']} -- tests/test_dynamodb/test_dynamodb_update_expressions.py"
    lines = script.splitlines()
    assert lines[:5] == ["#!/bin/bash", "set -uxo pipefail", "cd /testbed", "source /opt/miniconda3/bin/activate",
                         "conda activate testbed"]
    assert lines.count(reset) == 2 and row["test_patch"].rstrip("\n") in script


def test_swe_smith_keeps_the_bug_and_reports_non_python_profiles():
    smith, go = load_tasks(str(FIXTURES / "swe_smith.jsonl"))
    assert smith.extra["bug_patch"].startswith("diff --git a/pandas/core/indexes/base.py")
    assert smith.base_commit == "d1c5199b6a9d7ae9382d26ee2859b837107165e7"
    assert go.image == "jyangballin/swesmith.x86_64.ariga_1776_atlas.1afaaba2" and not go.gradable
    with pytest.raises(TaskError, match=r"^task ariga__atlas\.1afaaba2\.mutation__token: field 'eval_script': "
                                        r"not gradable here: no eval_script \(the tests of ariga__atlas are not"):
        go.require_gradable()


def test_sao_tasks_list_says_the_format_and_why_a_row_is_not_gradable(capsys):
    from sao_harness.sao.cli import main

    assert main(["tasks", "list", "--source", str(FIXTURES / "swe_smith.jsonl")]) == 0
    out = capsys.readouterr().out.splitlines()
    pandas = next(line for line in out if line.startswith("pandas-dev__pandas.95280573.pr_53652 "))
    assert pandas.split()[2:5] == ["swe-smith", "-", "yes"]  # format, difficulty, gradable
    assert "2 task(s) from" in out[-2] and "(format: swe-smith, adapter auto)" in out[-2]
    assert out[-1].startswith("  task ariga__atlas.1afaaba2.mutation__token: field 'eval_script': not gradable here")


def test_swe_smith_gold_patch_is_the_bug_undone(tmp_path):
    """`git apply` of the bug then of the adapter's gold patch gives the clean file back."""
    from sao_harness.tasks.formats.adapters import reverse_patch

    clean = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b"  # no newline at the end
    bug = ("diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1,5 +1,5 @@\n def add(a, b):\n-    return a + b\n"
           "+    return a - b\n \n \n def sub(a, b):\n@@ -5 +5 @@ def sub(a, b):\n-    return a - b\n"
           "\\ No newline at end of file\n+    return a + b\n\\ No newline at end of file\n")
    (tmp_path / "m.py").write_text(clean)
    for diff in (bug, reverse_patch(bug)):
        subprocess.run(["git", "apply", "-"], input=diff, text=True, cwd=tmp_path, check=True)
    assert (tmp_path / "m.py").read_text() == clean
    added = "diff --git a/n.py b/n.py\nnew file mode 100644\n--- /dev/null\n+++ b/n.py\n@@ -0,0 +1 @@\n+x\n"
    assert reverse_patch(added) is None  # not a modification: no gold patch rather than a wrong one
    smith = load_tasks(str(FIXTURES / "swe_smith.jsonl"))[0]
    assert smith.patch == reverse_patch(smith.extra["bug_patch"]) and "+        if lib.is_np_dtype(" in smith.patch


def test_swe_smith_old_image_names_get_the_published_form():
    from sao_harness.tasks.formats.adapters import swe_smith_image

    assert swe_smith_image("swesmith.x86_64.pandas-dev__pandas.95280573") == \
        "jyangballin/swesmith.x86_64.pandas-dev_1776_pandas.95280573"


def test_swe_rebench_uses_install_config(tmp_path):
    (row,) = rows("swe_rebench.jsonl")
    row = dict(row, install_config=dict(row["install_config"], test_cmd=["pip list", "pytest -rA --tb=line"]),
               test_patch="diff --git a/tests/test_utils.py b/tests/test_utils.py\n--- a/tests/test_utils.py\n"
                          "+++ b/tests/test_utils.py\n@@ -1 +1 @@\n-a\n+b\n")
    (t,) = load_tasks(str(_jsonl(tmp_path / "r.jsonl", [row])))
    lines = t.eval_script.splitlines()
    start = lines.index(": '>>>>> Start Test Output'")
    assert lines[start + 1:start + 3] == ["pip list", "pytest -rA --tb=line tests/test_utils.py"]
    assert t.extra["FAIL_TO_FAIL"] == [] and t.extra["meta_is_lite"] is False
    row["install_config"]["log_parser"] = "parse_log_nope"
    with pytest.raises(TaskError, match=r"field 'log_parser': unknown log parser 'parse_log_nope'"):
        load_tasks(str(_jsonl(tmp_path / "bad.jsonl", [row])))


# --- R2E-Gym: the script's output, graded by swebench with the row's tests -------------------
RUN_TESTS = """#!/bin/bash
cat <<'EOF'
============================= short test summary info ==============================
PASSED r2e_tests/test_1.py::TestUrlDispatcher::test_add_invalid_path
FAILED r2e_tests/test_1.py::TestUrlDispatcher::test_add_route_root - AssertionError: boom
PASSED r2e_tests/test_1.py::test_plain
========================= 1 failed, 2 passed in 0.12s ==============================
EOF
exit 1
"""


def test_r2e_script_output_grades_with_r2e_test_ids(tmp_path):
    """The generated test command, run on a stand-in run_tests.sh, rewrites pytest's ids into R2E-Gym's;
    swebench's own grading then reads the FAIL_TO_PASS derived from the recorded pre-fix run."""
    from swebench.harness.grading import get_eval_report

    before = RUN_TESTS.replace("PASSED r2e_tests/test_1.py::TestUrlDispatcher::test_add_invalid_path",
                               "FAILED r2e_tests/test_1.py::TestUrlDispatcher::test_add_invalid_path")
    row = {"repo_name": "aiohttp", "docker_image": "namanjain12/aiohttp_final:abc", "commit_hash": "abc",
           "problem_statement": "[ISSUE]\nthe router breaks\n[/ISSUE]",
           "parsed_commit_content": json.dumps({"old_commit_hash": "0ld", "new_commit_hash": "abc"}),
           "expected_output_json": json.dumps({"TestUrlDispatcher.test_add_invalid_path": "PASSED",
                                               "TestUrlDispatcher.test_add_route_root": "FAILED",
                                               "test_plain": "PASSED"}),
           "execution_result_content": json.dumps({"old_commit_res_stdout": before})}
    (t,) = load_tasks(str(_jsonl(tmp_path / "r2e.jsonl", [row])))
    assert (t.instance_id, t.base_commit, t.problem_statement) == ("aiohttp__abc", "0ld", "the router breaks")
    assert (t.FAIL_TO_PASS, t.PASS_TO_PASS) == (["TestUrlDispatcher.test_add_invalid_path"], ["test_plain"])
    lines = t.eval_script.splitlines()  # the patch cannot bring its own tests or runner
    assert lines.index("rm -rf r2e_tests") < lines.index("ln -s /r2e_tests r2e_tests") < lines.index(R2E_TEST_CMD)
    assert "git checkout -q HEAD -- run_tests.sh 2>/dev/null || true" in lines
    assert t.episode_setup == R2E_EPISODE_SETUP and t.to_row()["episode_setup"] == R2E_EPISODE_SETUP
    work = tmp_path / "testbed"
    work.mkdir()
    (work / "run_tests.sh").write_text(RUN_TESTS)
    out = subprocess.run(["bash", "-c", f"set -o pipefail; {R2E_TEST_CMD}; echo rc=$?"], cwd=work,
                         capture_output=True, text=True).stdout
    assert "rc=1" in out  # the tests' exit status survives the rewrite (swebench records it)
    assert r2e_statuses("") == {}
    log = tmp_path / "test_output.txt"
    log.write_text(f">>>>> Start Test Output\n{out}>>>>> End Test Output\n")
    spec = t.test_spec()
    report = get_eval_report(spec, {"instance_id": t.instance_id, "model_patch": "x"}, str(log),
                             include_tests_status=True)
    assert report[t.instance_id]["resolved"] is True


# --- preflight: grouped reasons, stop or skip ---------------------------------------------------
def test_usable_tasks_groups_reasons_and_stops_or_skips():
    tasks, errors = load_tasks_lenient(str(FIXTURES / "swe_smith.jsonl"))
    lines: list[str] = []
    missing = lambda t: "image not present locally" if "pandas" in t.instance_id else None  # noqa: E731
    with pytest.raises(UserError, match=r"^2 of 2 tasks not usable \(image not present locally; not gradable: "
                                        r"no eval_script\); fix them, or set tasks.skip_ungradable=true"):
        usable_tasks(tasks, errors, skip=False, image_problem=missing, log=lines.append)
    assert lines[0] == "tasks: 0 of 2 usable (format: swe-smith)"
    assert lines[1].startswith("  1 x ") and "ariga__atlas.1afaaba2.mutation__token" in "".join(lines)
    lines.clear()
    assert usable_tasks(tasks, errors, skip=True, log=lines.append) == tasks[:1]
    assert lines[0] == "tasks: 1 of 2 usable (format: swe-smith)"
    with pytest.raises(UserError, match="no usable tasks"):
        usable_tasks(tasks[1:], [], skip=True, log=lines.append)


def _broken_repo(tmp_path) -> Path:
    """A generated task repo whose second task has no log parser: gradable, then not."""
    repo = make_task_repo(tmp_path / "repo")
    meta = repo / "tasks" / TASK_IDS[1] / "task.yaml"
    data = yaml.safe_load(meta.read_text())
    del data["log_parser"]
    meta.write_text(yaml.safe_dump(data))
    return repo


def test_sao_train_stops_before_the_first_episode(tmp_path, project_root):
    repo = _broken_repo(tmp_path)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "sao_harness.sao.cli", "train", "--config", "configs/local.yaml",
                           f"tasks.source={repo}", f"run.root={tmp_path / 'runs'}"], cwd=project_root,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    took = time.monotonic() - t0
    assert proc.returncode == 2, proc.stderr
    assert "tasks: 1 of 2 usable (format: swebench)" in proc.stdout
    assert f"  1 x not gradable: no log_parser: {TASK_IDS[1]}" in proc.stdout
    assert "sao train: 1 of 2 tasks not usable (not gradable: no log_parser)" in proc.stderr
    assert took < 10, f"took {took:.1f} s"
    assert not (tmp_path / "runs").exists()  # nothing started


def test_sao_train_skips_the_unusable_with_skip_ungradable(tmp_path, monkeypatch, capsys):
    """With tasks.skip_ungradable=true, `sao train` trains on the usable tasks (the loop itself stubbed)."""
    import types

    from sao_harness.sao.cli import main

    seen = {}
    loop = types.SimpleNamespace(LoopError=RuntimeError,  # a stand-in: the real loop would start Ray and a model
                                 train=lambda cfg, tasks, log: seen.setdefault("ids", [t.instance_id for t in tasks]))
    monkeypatch.setitem(sys.modules, "sao_harness.trainer.run.loop", loop)
    assert main(["train", "--config", "configs/local.yaml", f"tasks.source={_broken_repo(tmp_path)}",
                 "tasks.skip_ungradable=true", f"run.root={tmp_path / 'runs'}"]) == 0
    assert seen["ids"] == [TASK_IDS[0]]
    assert capsys.readouterr().out.startswith("tasks: 1 of 2 usable (format: swebench)\n")


def _jsonl(path: Path, data: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in data))
    return path


# --- a bundled task as a SWE-Gym row, graded end to end (Docker) ---------------------------------
def test_a_bundled_task_as_a_swe_gym_row_resolves_with_its_gold_patch(docker_engine, tmp_path, monkeypatch):
    """The SWE-Gym path (eval script made from the repo's test command, the test patch, the base commit)
    graded by swebench in the task's image: the gold patch resolves, no patch does not."""
    from sao_harness.sao.config import load_config
    from sao_harness.tasks.formats import specs
    from sao_harness.tasks.formats.loaders import BUNDLED
    from sao_harness.tasks.grading.grade import grade, run_swebench
    from sao_harness.tasks.grading.grade_status import GradeStatus
    from sao_harness.tasks.images.prepare import build_repo_images

    (bundled,) = load_tasks("bundled", instances=["sao-harness__minicfg-11"])
    build_repo_images(load_config("configs/local.yaml"), docker_engine, BUNDLED, [bundled], log=lambda *_: None)
    monkeypatch.setitem(specs.SWE_GYM, "sao-harness/minicfg", {"test_cmd": "python3 -m pytest -rA -p no:cacheprovider"})
    row = {k: v for k, v in bundled.to_row().items()
           if k not in ("eval_script", "log_parser", "eval_type", "environment_setup_commit", "split", "datasets")}
    (t,) = load_tasks(str(_jsonl(tmp_path / "gym.jsonl", [row])))
    assert t.adapter == "swe-gym" and t.eval_script != bundled.eval_script and t.image == bundled.image
    r = grade(t, t.patch, client=docker_engine, log_root=tmp_path / "logs")
    assert r.official_status == r.status == GradeStatus.RESOLVED, r.error
    v = run_swebench(t, "", run_id="unpatched-1", skip_patch=True, client=docker_engine, log_root=tmp_path / "logs")
    assert v.status == GradeStatus.UNRESOLVED


def test_r2e_episode_setup_hides_the_held_out_tests(make_sandbox):
    """What the episode runs before the agent (harness.episode): tests and runner out of the repo, as R2E-Gym does."""
    sb = make_sandbox()
    sb.run("mkdir -p /r2e_tests /testbed && echo t > /r2e_tests/test_1.py && echo r > /testbed/run_tests.sh",
           check=True)
    sb.run(R2E_EPISODE_SETUP, check=True)
    assert sb.run("cat /root/r2e_tests/test_1.py /root/run_tests.sh").output.split() == ["t", "r"]
    assert sb.run("ls /r2e_tests /testbed/run_tests.sh").exit_code != 0
    sb.run(R2E_EPISODE_SETUP, check=True)  # idempotent: nothing left to move is not an error


def test_r2e_rows_pass_the_preflight_check(tmp_path):
    """R2E-Gym rows have a guarded grade (the clean run finds /r2e_tests): usable, no longer held back."""
    (task,) = [t for t in load_tasks(str(FIXTURES / "r2e_gym.jsonl")) if t.instance_id == "aiohttp__f0d74880deec"]
    lines = []
    assert usable_tasks([task], [], skip=False, log=lines.append) == [task]
    assert lines == ["tasks: 1 of 1 usable (format: r2e-gym)"]


def test_r2e_test_ids_are_found_in_the_held_out_files():
    """R2E-Gym names a test without its file (``Class.test[params]``); the clean run grades the node ids
    of every held-out file that defines it (pytest's default collection, read from the AST)."""
    from sao_harness.tasks.grading.clean_run import r2e_node_ids

    sources = {"r2e_tests/test_1.py": b"class TestA:\n    def test_x(self): pass\n    def helper(self): pass\n"
                                      b"    class TestIn:\n        def test_y(self): pass\n"
                                      b"def test_plain(): pass\nclass Other:\n    def test_no(self): pass\n",
               "r2e_tests/test_2.py": b"import pytest\n@pytest.mark.parametrize('v', [1])\ndef test_p(v): pass\n"
                                      b"def test_plain(): pass\n",
               "r2e_tests/test_3.py": b"def broken(:\n"}
    ids = ["TestA.test_x", "TestA.TestIn.test_y", "test_plain", "test_p[1]", "TestA.helper", "Other.test_no"]
    assert r2e_node_ids(sources, ids) == {
        "TestA.test_x": ["r2e_tests/test_1.py::TestA::test_x"],
        "TestA.TestIn.test_y": ["r2e_tests/test_1.py::TestA::TestIn::test_y"],
        "test_plain": ["r2e_tests/test_1.py::test_plain", "r2e_tests/test_2.py::test_plain"],
        "test_p[1]": ["r2e_tests/test_2.py::test_p[1]"]}  # helper, Other: not tests; left out (an infra failure)
