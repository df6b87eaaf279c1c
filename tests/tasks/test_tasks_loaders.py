"""Task model and loaders on local fixtures: SWE-bench Verified, SWE-Gym, SWE-smith, SWE-bench-extra
rows, malformed rows, generated task repos, and the fast failure of an unreachable hub."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sao_harness.core.errors import UserError
from sao_harness.sao.cli import main
from sao_harness.tasks.formats.adapters import ADAPTERS, COLUMNS
from sao_harness.tasks.formats.loaders import load_task_repo, load_tasks, load_tasks_lenient
from sao_harness.tasks.model import Task, TaskError
from tests.support.task_repos import TASK_IDS, make_task_repo

PATCH = "diff --git a/a.py b/a.py\n--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"
TEST_PATCH = ("diff --git a/tests/test_a.py b/tests/test_a.py\n--- a/tests/test_a.py\n+++ b/tests/test_a.py\n"
              "@@ -1 +1 @@\n-y\n+z\n")


def verified_row(iid="astropy__astropy-12907", **over):
    row = {"repo": "astropy/astropy", "instance_id": iid, "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607",
           "patch": PATCH, "test_patch": TEST_PATCH, "problem_statement": "Modeling's separability_matrix ...",
           "hints_text": "", "created_at": "2022-03-03T15:14:54Z", "version": "4.3",
           "FAIL_TO_PASS": json.dumps(
               ["astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]"]),
           "PASS_TO_PASS": json.dumps(["astropy/modeling/tests/test_separable.py::test_coord_matrix"]),
           "environment_setup_commit": "298ccb478e6bf092953bca67a3d29dc6c35f6752", "difficulty": "15 min - 1 hour"}
    row.update(over)
    return row


def swe_gym_row(iid="getmoto__moto-5752"):
    return {"instance_id": iid, "hints_text": "", "patch": PATCH, "test_patch": TEST_PATCH,
            "created_at": "2022-12-10", "problem_statement": "describe_parameters ...", "repo": "getmoto/moto",
            "base_commit": "b2300f1eae1323e3e8bc45f97e530ce129dff12e", "version": "4.0",
            "PASS_TO_PASS": ["tests/test_ssm/test_ssm_boto3.py::test_get_parameter"],
            "FAIL_TO_PASS": ["tests/test_ssm/test_ssm_boto3.py::test_describe_parameters__multiple_tags"]}


def swe_smith_row(iid="pylint-dev__astroid.b114f6b5.func_basic__00ev1hfe"):
    return {"instance_id": iid, "repo": "swesmith/pylint-dev__astroid.b114f6b5", "patch": PATCH,
            "FAIL_TO_PASS": ["tests/test_inference.py::test_formatted_fstring_inference"],
            "PASS_TO_PASS": ["tests/test_inference.py::test_fstring_inference"],
            "image_name": "jyangballin/swesmith.x86_64.pylint-dev_1776_astroid.b114f6b5",
            "problem_statement": "f-string inference is wrong"}


def extra_row(iid="0b01001001__spectree-64"):
    row = swe_gym_row(iid)
    row.update(repo="0b01001001/spectree", environment_setup_commit="a091fab020ac26548250c907bae0855273a98778",
               meta={"failed_lite_validators": ["has_many_modified_files"], "has_test_patch": True, "is_lite": False})
    return row


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# --- SWE-bench Verified shaped rows -----------------------------------------------------------
def test_verified_rows_load_but_are_not_gradable_here(tmp_path):
    f = write_jsonl(tmp_path / "verified.jsonl", [verified_row(), verified_row("django__django-11099")])
    tasks = load_tasks(str(f))
    assert [t.instance_id for t in tasks] == ["astropy__astropy-12907", "django__django-11099"]
    t = tasks[0]
    assert t.FAIL_TO_PASS == ["astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]"]
    assert t.difficulty == "15 min - 1 hour"
    assert t.image == "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest"  # swebench's derived name
    assert not t.gradable and t.adapter == "swebench"
    assert t.missing_fields() == ["eval_script", "log_parser", "eval_type"]
    assert t.grading_gaps()[0].startswith("no eval_script (a classic SWE-bench row")
    with pytest.raises(TaskError, match=r"^task astropy__astropy-12907: field 'eval_script': not gradable here: "
                                        r"no eval_script \(a classic SWE-bench row"):
        t.require_gradable()
    row = t.to_row()
    assert row["environment_setup_commit"] == "298ccb478e6bf092953bca67a3d29dc6c35f6752"


def test_swebench5_rows_are_gradable(tmp_path):
    row = verified_row(image="swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest",
                       eval_script="#!/bin/bash\n: '>>>>> Start Test Output'\npytest\n: '>>>>> End Test Output'\n",
                       log_parser="parse_log_astropy", eval_type="pass_and_fail")
    pq.write_table(pa.Table.from_pylist([row]), tmp_path / "v5.parquet")
    (t,) = load_tasks(str(tmp_path / "v5.parquet"))
    assert t.gradable and t.notes == []
    spec = t.test_spec()
    assert spec.log_parser == "parse_log_astropy" and spec.FAIL_TO_PASS == t.FAIL_TO_PASS


def test_json_and_save_to_disk_sources(tmp_path):
    import datasets

    (tmp_path / "rows.json").write_text(json.dumps([verified_row()]))
    assert load_tasks(str(tmp_path / "rows.json"))[0].instance_id == "astropy__astropy-12907"
    datasets.DatasetDict({"test": datasets.Dataset.from_list([swe_gym_row()])}).save_to_disk(str(tmp_path / "ds"))
    (t,) = load_tasks(str(tmp_path / "ds"), split="test", adapter="swe-gym")
    assert t.FAIL_TO_PASS == ["tests/test_ssm/test_ssm_boto3.py::test_describe_parameters__multiple_tags"]


# --- training-set adapters (real rows of each format: tests/tasks/test_tasks_formats.py) --------
def test_swe_gym_adapter(tmp_path):
    f = write_jsonl(tmp_path / "gym.jsonl", [swe_gym_row()])
    (t,) = load_tasks(str(f), adapter="swe-gym")
    assert t.image == "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5752"  # lowercase, no tag: OpenHands' name
    assert t.gradable and t.log_parser == "parse_log_pytest" and t.eval_type == "pass_and_fail"
    assert "pytest -n0 -rA tests/test_a.py\n" in t.eval_script  # moto's command on the test patch's files


def test_swe_gym_is_auto_detected_and_mypy_selects_cases(tmp_path):
    mypy = dict(swe_gym_row("python__mypy-11134"), repo="python/mypy", version="0.920",
                FAIL_TO_PASS=["mypy/test/testcheck.py::TypeCheckSuite::check-classes.test::testA"],
                PASS_TO_PASS=["mypy/test/testcheck.py::TypeCheckSuite::check-classes.test::testB"])
    new = dict(mypy, instance_id="python__mypy-16000", version="1.7")
    unknown = dict(swe_gym_row("acme__tool-1"), repo="acme/tool")
    tasks = load_tasks(str(write_jsonl(tmp_path / "gym.jsonl", [mypy, new, unknown])))  # adapter=auto
    assert [t.adapter for t in tasks] == ["swe-gym", "swe-gym", "swebench"]  # an unknown repo is not SWE-Gym's
    assert "pytest -n0 -rA -k 'testA or testB'\n" in tasks[0].eval_script
    assert "pytest -rA -k 'testA or testB'\n" in tasks[1].eval_script  # mypy >= 1.7: no -n0
    with pytest.raises(TaskError, match=r"field 'eval_script'"):
        load_tasks(str(write_jsonl(tmp_path / "u.jsonl", [unknown])), adapter="swe-gym")[0].require_gradable()


def test_swe_smith_adapter_is_auto_detected(tmp_path):
    f = write_jsonl(tmp_path / "smith.jsonl", [swe_smith_row()])
    (t,) = load_tasks(str(f))  # adapter=auto
    assert t.adapter == "swe-smith"
    assert t.image == "jyangballin/swesmith.x86_64.pylint-dev_1776_astroid.b114f6b5"
    assert t.extra["bug_patch"] == PATCH and t.patch.splitlines()[-2:] == ["+x = 1", "-x = 2"]  # the bug undone
    assert t.base_commit == t.instance_id  # no base_commit column: the instance's branch
    assert any("introduces the bug" in n for n in t.notes)
    assert t.gradable
    assert "pytest --disable-warnings --color=no --tb=no --verbose -rA tests/test_inference.py\n" in t.eval_script


def test_swe_bench_extra_adapter_parquet(tmp_path):
    pq.write_table(pa.Table.from_pylist([extra_row()]), tmp_path / "extra.parquet")
    (t,) = load_tasks(str(tmp_path / "extra.parquet"))  # auto-detected by its meta struct
    assert t.adapter == "swe-bench-extra" and t.extra["meta_is_lite"] is False
    assert t.missing_fields()[0] == "image" and not t.gradable


# --- malformed rows: errors name the instance and the field ----------------------------------
@pytest.mark.parametrize("row, pattern", [
    (verified_row("x__y-1", base_commit=None), r"^task x__y-1: field 'base_commit': missing$"),
    ({k: v for k, v in verified_row("x__y-2").items() if k != "PASS_TO_PASS"},
     r"^task x__y-2: field 'PASS_TO_PASS': missing$"),
    (verified_row("x__y-3", FAIL_TO_PASS='["a", '), r"^task x__y-3: field 'FAIL_TO_PASS': not valid JSON \("),
    (verified_row("x__y-4", FAIL_TO_PASS='{"a": 1}'), r"^task x__y-4: field 'FAIL_TO_PASS': must be a list"),
    (verified_row("x__y-5", log_parser="parse_log_nope"),
     r"^task x__y-5: field 'log_parser': unknown log parser 'parse_log_nope': not in swebench's PARSER_REGISTRY"),
    (verified_row("x__y-6", eval_type="sometimes"), r"^task x__y-6: field 'eval_type': 'sometimes' is not one of"),
    (verified_row("x__y-7", eval_script="pytest\n"),
     r"^task x__y-7: field 'eval_script': has no '>>>>> Start Test Output'"),
    (verified_row("x__y-8", patch="just words"), r"^task x__y-8: field 'patch': does not look like a unified diff"),
    ({"repo": "a/b"}, r"^task \?: field 'instance_id': missing"),
])
def test_malformed_rows(tmp_path, row, pattern):
    f = write_jsonl(tmp_path / "bad.jsonl", [row])
    with pytest.raises(TaskError, match=pattern):
        load_tasks(str(f))


def test_unknown_format_lists_the_formats_and_their_columns(tmp_path):
    f = write_jsonl(tmp_path / "qa.jsonl", [{"question": "2 + 2?", "answer": "4"}])
    with pytest.raises(UserError) as e:
        load_tasks_lenient(str(f))  # the source's format, not a row's fault: even the lenient loader stops
    msg = str(e.value)
    assert msg.startswith(f"{f}: a row of no known dataset format (its columns: answer, question)")
    for name, columns in COLUMNS.items():
        assert f"{name}: {columns}" in msg
    assert set(COLUMNS) == set(ADAPTERS) and "r2e-gym: repo_name, commit_hash, docker_image" in msg
    assert "\n" not in msg


def test_lenient_load_keeps_good_rows(tmp_path):
    f = write_jsonl(tmp_path / "mixed.jsonl", [verified_row("ok__ok-1"),
                                               verified_row("bad__bad-1", FAIL_TO_PASS="nope"),
                                               verified_row("ok__ok-1")])
    tasks, errors = load_tasks_lenient(str(f))
    assert [t.instance_id for t in tasks] == ["ok__ok-1"]
    assert [str(e).split(":")[0] for e in errors] == ["task bad__bad-1", "task ok__ok-1"]
    assert "duplicate" in str(errors[1])


def test_unknown_sources(tmp_path):
    with pytest.raises(UserError, match="task source not found"):
        load_tasks(str(tmp_path / "missing.jsonl"))
    with pytest.raises(UserError, match=r"no task nope"):
        load_tasks(str(write_jsonl(tmp_path / "a.jsonl", [verified_row()])), instances=["nope"])


def test_parser_registry_is_swebench_s():
    from swebench.harness.log_parsers import PARSER_REGISTRY

    row = verified_row(log_parser="parse_log_pytest")
    assert Task.from_row(row).log_parser in PARSER_REGISTRY


# --- Hugging Face ids fail fast offline --------------------------------------------------------
def test_hub_id_fails_fast_when_offline_flag(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.monotonic()
    with pytest.raises(UserError, match=r"hub is unreachable.*pass a local file"):
        load_tasks("SWE-bench/SWE-bench_Verified")
    assert time.monotonic() - t0 < 15


def test_hub_id_fails_fast_by_probe(project_root):
    """A fresh process without HF_HUB_OFFLINE: the reachability probe fails in seconds, not minutes."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "sao_harness.sao.cli", "tasks", "list", "--source",
                           "SWE-bench/SWE-bench_Verified"], cwd=project_root, env=env, capture_output=True,
                          text=True, timeout=120)
    took = time.monotonic() - t0
    assert proc.returncode == 2, proc.stderr
    assert "hub is unreachable" in proc.stderr and "pass a local file" in proc.stderr
    assert took < 15, f"took {took:.1f} s"


# --- task repositories ------------------------------------------------------------------------
def test_generated_task_repo_loads(tmp_path, capsys):
    repo = make_task_repo(tmp_path / "repo")
    tasks = load_task_repo(repo)
    assert [t.instance_id for t in tasks] == list(TASK_IDS)
    assert all(t.gradable and t.difficulty == "easy" for t in tasks)
    assert main(["tasks", "show", TASK_IDS[0], "--source", str(repo)]) == 0
    out = capsys.readouterr().out
    assert "returns -1; it should return 5" in out and "FAIL_TO_PASS (1): tests/test_ops.py::test_add" in out


def test_incomplete_task_dir_is_named(tmp_path):
    repo = make_task_repo(tmp_path / "repo")
    (repo / "tasks" / TASK_IDS[1] / "eval.sh").unlink()
    tasks, errors = load_tasks_lenient(str(repo))
    assert [t.instance_id for t in tasks] == [TASK_IDS[0]]
    assert str(errors[0]) == f"task {TASK_IDS[1]}: task directory incomplete: missing eval.sh"


def test_recipe_hash_tracks_build_inputs(tmp_path):
    from sao_harness.tasks.images.build import recipe_hash

    repo = make_task_repo(tmp_path / "repo")
    d = repo / "tasks" / TASK_IDS[0]
    h = recipe_hash(d, "sha256:base1")
    assert recipe_hash(d, "sha256:base1") == h
    assert recipe_hash(d, "sha256:base2") != h
    (d / "problem_statement.md").write_text("reworded\n")  # not part of the build
    assert recipe_hash(d, "sha256:base1") == h
    (d / "repo.bundle").write_bytes(b"other")
    assert recipe_hash(d, "sha256:base1") != h
