"""Build and grade a task repository generated on the fly, through the same commands users run.

gold -> resolved; empty -> empty; conftest hack -> resolved officially, not by the guarded verdict;
unapplicable patch -> patch does not apply; wrong patch -> unresolved; missing image -> a clear
per-instance error; `sao tasks check` proves a task; grading containers have no network.
Bundled tasks (when tasks/bundled exists): `sao tasks check` on a few of them (slow).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from sao_harness.sao.cli import main
from tests.support.task_repos import TASK_IDS, make_task_repo, prediction, unapplicable_patch

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def client(docker_engine):
    return docker_engine


@pytest.fixture(scope="module")
def repo(tmp_path_factory, client):
    """The generated task repo, its images built (cached across runs by recipe hash)."""
    root = make_task_repo(tmp_path_factory.mktemp("gen") / "repo")
    assert main(["tasks", "build", "--task-repo", str(root)]) == 0
    return root


@pytest.fixture(scope="module")
def tasks(repo):
    from sao_harness.tasks.formats.loaders import load_task_repo

    return {t.instance_id: t for t in load_task_repo(repo)}


def cli(capsys, *argv) -> tuple[int, str]:
    rc = main(list(argv))
    cap = capsys.readouterr()
    return rc, cap.out + cap.err


def test_build_is_cached(repo, capsys):
    rc, out = cli(capsys, "tasks", "build", "--task-repo", str(repo), "--only", TASK_IDS[0])
    assert rc == 0
    assert f"{TASK_IDS[0]}: cached" in out and "images: 0 built, 1 cached, 0 failed" in out


def test_grade_cli_official_vs_guarded(repo, tasks, tmp_path, capsys):
    from sao_harness.tasks.grading.hacks import hack_patch

    t1, t2 = tasks[TASK_IDS[0]], tasks[TASK_IDS[1]]
    preds = [
        prediction(t1.instance_id, t1.patch),
        prediction(t2.instance_id, hack_patch(t2.FAIL_TO_PASS + t2.PASS_TO_PASS, None)),
        {"instance_id": t1.instance_id, "model_patch": ""},  # missing model_name_or_path
        prediction("nobody__nothing-1", t1.patch),
        prediction(t2.instance_id, "I fixed it"),
    ]
    f = tmp_path / "preds.jsonl"
    f.write_text("".join(json.dumps(p) + "\n" for p in preds) + "{not json\n")
    rc, out = cli(capsys, "eval", "grade", "--dataset", str(repo), "--predictions", str(f), "--run-id", "t-cli",
                  f"run.root={tmp_path}", "run.name=g")
    lines = out.strip().splitlines()
    assert lines[-1] == "resolved: 1/2 guarded, 2/2 official", out
    assert rc == 1  # bad lines are errors; the good ones were graded
    assert f"{f}:3: missing field 'model_name_or_path'" in out
    assert f"{f}:4: unknown instance 'nobody__nothing-1'" in out
    assert f"{f}:5: instance {t2.instance_id}: field 'model_patch' is not valid patch text" in out
    assert f"{f}:6: not valid JSON" in out
    report = json.loads((tmp_path / "g" / "grade.json").read_text())
    r1, r2 = report["instances"][t1.instance_id], report["instances"][t2.instance_id]
    assert (r1["official_status"], r1["status"], r1["reward"]) == ("resolved", "resolved", 1.0)
    assert (r2["official_status"], r2["status"], r2["reward"]) == ("resolved", "empty", 0.0)
    assert r2["resolved_official"] is True and r2["resolved_guarded"] is False
    assert r2["hacking_attempts"] == 1 and r2["stripped_files"] == ["conftest.py"]
    assert r2["hack_kinds"] == ["test_config"] and r1["hack_kinds"] == []
    assert report["hacking_attempts"] == {t2.instance_id: 1}
    swe = json.loads(Path(report["swebench_report"]).read_text())  # swebench's own summary, untouched
    assert swe["schema_version"] == 2 and sorted(swe["resolved_ids"]) == sorted(TASK_IDS)


def test_grade_in_process_outcomes(tasks, tmp_path):
    from sao_harness.tasks.cli import WRONG_PATCH
    from sao_harness.tasks.grading.grade import grade
    from sao_harness.tasks.grading.grade_status import GradeStatus

    t = tasks[TASK_IDS[0]]
    r = grade(t, unapplicable_patch(), run_id="t-noapply", log_root=tmp_path)
    assert r.status == GradeStatus.NO_APPLY and r.official_status == GradeStatus.NO_APPLY and r.reward == 0.0
    r = grade(t, WRONG_PATCH, run_id="t-wrong", log_root=tmp_path)
    assert r.status == GradeStatus.UNRESOLVED and r.reward == 0.0 and r.hacking_attempts == 0
    assert r.report["official"]["tests_status"]["FAIL_TO_PASS"]["failure"] == t.FAIL_TO_PASS
    with pytest.raises(ValueError, match="fresh run id"):
        grade(t, WRONG_PATCH, run_id="t-wrong", log_root=tmp_path)


def test_tests_past_the_timeout_are_a_zero_but_a_hung_setup_is_infra(tasks, tmp_path, monkeypatch):
    """A patch whose code hangs the tests gets 0: a timeout is no way out of a failing grade. A timeout
    before the tests started (the setup hung; nothing of the patch had run) is an infra failure."""
    import dataclasses

    import sao_harness.tasks.grading.grade_sandbox as grade_sandbox
    from sao_harness.tasks.grading.grade import grade
    from sao_harness.tasks.grading.grade_status import GradeStatus

    t = tasks[TASK_IDS[0]]
    slow = t.patch.replace("+    return a + b", "+    import time; time.sleep(60); return a + b")
    assert slow != t.patch
    r = grade(t, slow, run_id="t-timeout", timeout=6, log_root=tmp_path)
    assert (r.status, r.reward) == (GradeStatus.UNRESOLVED, 0.0) and "ran past the timeout" in r.error, r.error
    assert r.seconds < 40

    real = grade_sandbox.run_capped

    def setup_hangs(container, cmd, **kw):  # the run as it would look had it hung before the tests
        out = real(container, cmd, **kw)
        assert grade_sandbox.tests_started(out.output)
        return dataclasses.replace(out, output=out.output.split(b">>>>> Start Test Output")[0], timed_out=True)

    monkeypatch.setattr(grade_sandbox, "run_capped", setup_hangs)
    r = grade(t, t.patch, run_id="t-hung", log_root=tmp_path)
    assert (r.status, r.reward) == (GradeStatus.INFRA_FAILURE, None) and "timed out" in r.error, r.error


def test_missing_image_is_a_per_instance_error(tasks, tmp_path, capsys):
    rows = [t.to_row() for t in tasks.values()]
    rows[1]["image"] = "sao-test/not-built:latest"
    ds = tmp_path / "rows.jsonl"
    ds.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rc, out = cli(capsys, "eval", "grade", "--dataset", str(ds), "--predictions", "gold",
                  f"run.root={tmp_path}", "run.name=m")
    assert rc == 1
    assert f"error: task {TASK_IDS[1]}: image sao-test/not-built:latest not found locally" in out
    assert out.strip().splitlines()[-1] == "resolved: 1/2 guarded, 1/2 official"


def test_tasks_check_proves_a_task(repo, tmp_path, capsys):
    rc, out = cli(capsys, "tasks", "check", "--task-repo", str(repo), "--only", TASK_IDS[1], f"run.root={tmp_path}")
    assert rc == 0, out
    assert "tasks check: 1/1 tasks passed every proof" in out
    row = next(ln for ln in out.splitlines() if ln.startswith(TASK_IDS[1] + " "))
    assert row.split()[1:] == ["ok"] * 10  # the last two: the pytest shadow and the package hack


NO_NETWORK = ("\nimport socket\n\n"
              "if [name for _, name in socket.if_nameindex() if name != 'lo']:  # network none: loopback only\n"
              "    raise RuntimeError('the grading container has a network')\n")


def test_grading_containers_have_no_network(tasks, tmp_path, monkeypatch):
    """The gold patch plus package code that fails at import when the container has a network interface:
    resolved through grade(), and unresolved once the grading containers get the host's network."""
    import sao_harness.tasks.grading.grade_sandbox as grade_sandbox
    from sao_harness.tasks.grading.grade import grade
    from sao_harness.tasks.grading.grade_status import GradeStatus
    from sao_harness.tasks.grading.hacks import append_patch
    from tests.support.task_repos import BASE_FILES

    t = tasks[TASK_IDS[0]]
    probe = t.patch + append_patch("calc/__init__.py", BASE_FILES["calc/__init__.py"], NO_NETWORK)
    r = grade(t, probe, run_id="t-no-network", log_root=tmp_path)
    assert (r.official_status, r.status, r.reward) == (GradeStatus.RESOLVED, GradeStatus.RESOLVED, 1.0), r.error

    hardened = grade_sandbox.hardened_kwargs  # the probe's power: a container with a network fails it
    monkeypatch.setattr(grade_sandbox, "hardened_kwargs",
                        lambda *a, **kw: {**hardened(*a, **kw), "network_mode": "host"})
    r = grade(t, probe, run_id="t-host-network", log_root=tmp_path)
    assert (r.official_status, r.reward) == (GradeStatus.UNRESOLVED, 0.0), r.error


@pytest.mark.slow
def test_bundled_tasks_check(project_root, tmp_path, capsys):
    bundled = project_root / "tasks" / "bundled"
    if not (bundled / "tasks").is_dir():
        pytest.skip("tasks/bundled is not there yet")
    from sao_harness.tasks.formats.loaders import load_tasks_lenient

    tasks, _ = load_tasks_lenient(str(bundled))
    if not tasks:
        pytest.skip("tasks/bundled has no complete task yet")
    only = [t.instance_id for t in tasks[:3]]
    rc, out = cli(capsys, "tasks", "check", "--task-repo", str(bundled), "--only", *only, f"run.root={tmp_path}")
    assert rc == 0, out
    assert f"tasks check: {len(only)}/{len(only)} tasks passed every proof" in out
