"""A bundled task converted into each public SWE training format runs an expert episode to `resolved`.

For each format, a bundled task (``tasks/bundled``) becomes a row in that dataset's columns with the
image that format expects (``tests.support.formats``: tagged, or for SWE-smith and R2E-Gym rebuilt in
their layout), written to a jsonl, loaded with ``tasks.adapter: auto`` (the adapter writes the eval the
way the format does), passed through the pre-flight check, and run through ``run_episode`` with the
expert engine: the sandbox, the OpenHands agent, the proxy, then the official and the guarded grade.
R2E-Gym's guarded grade finds its held-out tests in ``/r2e_tests`` (``tasks.grading.clean_run``): a patch that
reads the tests to return what they expect is resolved officially and gets 0.
"""
from __future__ import annotations

import json

import pytest

from sao_harness.harness.trace import Status
from sao_harness.tasks.formats import specs
from sao_harness.tasks.formats.loaders import BUNDLED, load_tasks, tasks_from_config
from tests.support.formats import FORMATS, SWE_GYM_SPEC, as_r2e_gym, with_gold

pytestmark = [pytest.mark.docker, pytest.mark.slow]

CASES = {  # format -> (bundled task, the image name the format's adapter gives it)
    "swebench": ("sao-harness__tablefmt-9", "swebench/sweb.eval.x86_64.sao-harness_1776_tablefmt-9:latest"),
    "swe-gym": ("sao-harness__semverkit-31", "xingyaoww/sweb.eval.x86_64.sao-harness_s_semverkit-31"),
    "swe-smith": ("sao-harness__spanlib-5", "jyangballin/swesmith.x86_64.sao-harness_1776_spanlib.{commit8}"),
    "r2e-gym": ("sao-harness__minicfg-11", "namanjain12/minicfg_final:{commit}"),
    "swe-rebench": ("sao-harness__minicfg-8", "swerebench/sweb.eval.x86_64.sao-harness_1776_minicfg-8"),
}


@pytest.fixture(scope="module")
def bundled(docker_engine):
    """The bundled tasks of CASES, their images built (cached by recipe)."""
    from sao_harness.sao.config import load_config
    from sao_harness.tasks.images.prepare import build_repo_images

    tasks = {t.instance_id: t for t in load_tasks("bundled", instances=[iid for iid, _ in CASES.values()])}
    build_repo_images(load_config("configs/local.yaml"), docker_engine, BUNDLED, list(tasks.values()),
                      log=lambda *_: None)
    return tasks


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _jsonl(path, row: dict):
    path.write_text(json.dumps(row) + "\n")
    return path


def _config(project_root, tmp_path, source):
    from sao_harness.sao.config import load_config

    return load_config(project_root / "configs/local.yaml", [
        f"run.root={tmp_path}", "run.name=formats", f"tasks.source={source}", "engine.kind=expert",
        "agent.profile=compact", "sampling.max_tokens=4096", "agent.stuck_detection=false",
        f"model.cache_dir={project_root / '.cache/sao'}"])


def _expert_episode(cfg, task, plan, tokenizer):
    """One episode of ``task`` by the expert engine planning from ``plan`` (a task with the gold patch)."""
    from sao_harness.envs.gc import run_scope
    from sao_harness.harness.engines.expert import ExpertEngine
    from sao_harness.harness.episode import EpisodeContext, run_episode
    from sao_harness.harness.expert import image_file_reader
    from sao_harness.harness.proxy import ProxyServer

    engine = ExpertEngine(tokenizer, [plan], read_file=image_file_reader(cfg.docker))
    proxy = ProxyServer(engine, tokenizer, cfg)
    proxy.start(port=0)
    run_id = f"formats-{task.adapter}"
    try:
        with run_scope(run_id):
            return run_episode(task, EpisodeContext(cfg=cfg, proxy=proxy, run_id=run_id))
    finally:
        proxy.stop()
        engine.close()


@pytest.mark.parametrize("fmt", list(CASES))
def test_a_bundled_task_in_each_format_runs_an_expert_episode_to_resolved(fmt, bundled, docker_engine, tokenizer,
                                                                          project_root, tmp_path, monkeypatch):
    from sao_harness.tasks.preflight import preflight

    iid, image = CASES[fmt]
    source = bundled[iid]
    if fmt == "swe-gym":  # SWE-Gym's harness has one test command per repo; this one is not among its 11
        monkeypatch.setitem(specs.SWE_GYM, source.repo, SWE_GYM_SPEC)
    row, note = FORMATS[fmt](source, docker_engine)
    cfg = _config(project_root, tmp_path, _jsonl(tmp_path / f"{fmt}.jsonl", row))
    tasks, errors = tasks_from_config(cfg)  # tasks.adapter: auto
    lines: list[str] = []
    (task,) = preflight(cfg, tasks, errors, log=lines.append)  # gradable, its image here
    assert lines == [f"tasks: 1 of 1 usable (format: {fmt})"]
    assert task.adapter == fmt and task.image == image.format(commit8=source.base_commit[:8],
                                                               commit=row.get("commit_hash"))
    if fmt != "swebench":  # the format's own eval, written by its adapter
        assert task.eval_script != source.eval_script
    plan = with_gold(task, source.patch) if note else task  # R2E-Gym's fix is not a diff in its row
    assert plan.patch.strip()
    traj = _expert_episode(cfg, task, plan, tokenizer)
    assert (traj.status, traj.reward) == (Status.OK, 1.0), (traj.status, traj.metadata, traj.grading)
    g = traj.grading
    # R2E-Gym's row carries no gold diff: the behaviour probe has no gold to compare with, and says so
    said = ["no_perturbation"] if fmt == "r2e-gym" else []
    assert (g["official_status"], g["status"], g["hack_kinds"]) == ("resolved", "resolved", said), g
    assert g["report"]["clean"]["FAIL_TO_PASS"]["success"] == task.FAIL_TO_PASS, g["report"]["clean"]


def test_r2e_gym_guarded_grade_runs_the_held_out_tests_and_catches_a_test_aware_patch(bundled, docker_engine,
                                                                                     tmp_path):
    """The clean run reads /r2e_tests from the image, grades R2E-Gym's ids (``test_x``, no file) by their
    node ids, and mutates them there: gold passes every test and fails every mutant; code that reads the
    calling test's source and returns what it expects passes the official run and gets 0."""
    from sao_harness.tasks.grading.grade import grade
    from tests.tasks.test_grade_behaviour import KNOWS_THE_TESTS, init_patch

    source = bundled["sao-harness__minicfg-11"]
    row, _ = as_r2e_gym(source, docker_engine)
    (task,) = load_tasks(str(_jsonl(tmp_path / "r2e.jsonl", row)))
    assert task.adapter == "r2e-gym" and task.FAIL_TO_PASS == [t.split("::")[-1] for t in source.FAIL_TO_PASS]
    gold = grade(task, source.patch, log_root=tmp_path / "logs")
    assert (gold.official_status, gold.status, gold.reward) == ("resolved", "resolved", 1.0), gold.to_dict()
    assert gold.report["mutated"] == [f"r2e_tests/test_1.py::{t}" for t in task.FAIL_TO_PASS][:1]  # not the [] one
    aware = init_patch(source, KNOWS_THE_TESTS.replace('"/tests/"', '"tests/"'))  # r2e_tests/ is a tests dir
    r = grade(task, aware, log_root=tmp_path / "logs")
    assert r.resolved_official is True, r.to_dict()  # run_tests.sh is fooled
    assert (r.status, r.reward) == ("unresolved", 0.0) and "test_aware" in r.hack_kinds, r.to_dict()
