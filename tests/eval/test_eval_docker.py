"""`sao eval` end to end on bundled tasks, through the same path as `make eval`: episodes in Docker
sandboxes (OpenHands agent, proxy), predictions.jsonl, official swebench grading, the report.

The gold ``ScriptedPolicyEngine`` (a test double that applies each gold patch with the agent's file
editor) scores 100%; a policy that only calls ``finish`` scores 0%; an interrupted eval resumes
without redoing predicted or graded instances; the gold preflight stops a broken environment before
any episode; the tiny model runs through the CLI.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from sao_harness.harness.trace import Status
from sao_harness.sao.cli import main
from sao_harness.tasks.grading.grade_status import INFRA_FAILURES

pytestmark = pytest.mark.docker

GOLD_IDS = ["sao-harness__minicfg-11", "sao-harness__semverkit-34", "sao-harness__tablefmt-13"]
# the gold policy writes whole hunks per turn: room for them (the model's own limits are not under test)
ROOMY = ["sampling.max_tokens=4096", "proxy.context_budget=65536", "agent.max_iterations=20"]


@pytest.fixture(scope="module")
def client(docker_engine):
    return docker_engine


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def config(tmp_path, *overrides):
    from sao_harness.sao.config import load_config

    return load_config("configs/local.yaml", [f"run.root={tmp_path}", "run.name=r", *ROOMY, *overrides])


def tasks_of(ids):
    from sao_harness.tasks.formats.loaders import load_tasks

    return load_tasks("bundled", instances=list(ids))


class Served:
    """A scripted engine behind a started proxy, for ``run_eval(engine=, proxy=)``."""

    def __init__(self, engine, cfg):
        from sao_harness.harness.proxy import ProxyServer

        self.engine = engine
        self.proxy = ProxyServer(engine, engine.tokenizer, cfg)
        self.proxy.start(port=0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proxy.stop()


def gold_engine(tokenizer, ids):
    from sao_harness.harness.engines.scripted_policy import ScriptedPolicyEngine

    return ScriptedPolicyEngine.gold(tokenizer, tasks_of(ids))


def empty_engine(tokenizer, ts):
    """A policy that only calls ``finish`` (past its empty script): an empty patch for every task."""
    from sao_harness.harness.engines.scripted_policy import ScriptedPolicyEngine

    return ScriptedPolicyEngine(tokenizer, {t.instance_id: [] for t in ts},
                                {t.instance_id: t.problem_statement for t in ts})


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_gold_policy_scores_100_percent(tmp_path, client, tokenizer):
    from sao_harness.eval.run import run_eval

    cfg = config(tmp_path, f"eval.instances={json.dumps(GOLD_IDS)}", "eval.name=gold")
    with Served(gold_engine(tokenizer, GOLD_IDS), cfg) as s:
        out = run_eval(cfg, gold=True, engine=s.engine, proxy=s.proxy)
    r = out.report
    assert out.resolved_line == "resolved: 3/3 guarded, 3/3 official", r["instances"]
    assert r["resolved_rate_guarded"] == 1.0 and not r[INFRA_FAILURES] and not r["hacking_attempts"]
    d = tmp_path / "r" / "eval" / "gold"
    assert out.dir == d
    preds = lines(d / "predictions.jsonl")
    assert sorted(p["instance_id"] for p in preds) == sorted(GOLD_IDS)
    assert all(set(p) == {"instance_id", "model_name_or_path", "model_patch"} and p["model_patch"] for p in preds)
    summary = json.loads(Path(r["swebench_report"]).read_text())  # swebench's own, untouched
    assert sorted(summary["resolved_ids"]) == sorted(GOLD_IDS) and summary["schema_version"] == 2
    assert (d / "preflight" / "gold.json").is_file()
    assert len(list((d / "traces").glob("shard-*.parquet"))) == 3
    assert all(row["turns"] >= 3 and row["tokens"] > 0 and row["episode_status"] == Status.OK for row in r["instances"])
    html = (d / "report.html").read_text()
    assert 'src="data:image/png;base64,' in html and all(f"<td>{i}</td>" in html for i in GOLD_IDS)


def test_empty_policy_scores_0_percent(tmp_path, client, tokenizer):
    from sao_harness.eval.run import run_eval

    ids = GOLD_IDS[:2]
    cfg = config(tmp_path, f"eval.instances={json.dumps(ids)}")
    with Served(empty_engine(tokenizer, tasks_of(ids)), cfg) as s:
        out = run_eval(cfg, engine=s.engine, proxy=s.proxy)
    assert out.resolved_line == "resolved: 0/2 guarded, 0/2 official"
    assert out.report["verdicts"] == {"empty": 2}
    assert all(p["model_patch"] == "" for p in lines(out.dir / "predictions.jsonl"))


def test_resume_after_interruption(tmp_path, client, tokenizer, capsys):
    """Predictions already written (one instance, plus a line torn by the crash) are not redone;
    a second run redoes nothing at all."""
    from sao_harness.eval.run import run_eval

    ids = GOLD_IDS[:2]
    done, todo = ids
    cfg = config(tmp_path, f"eval.instances={json.dumps(ids)}", "eval.name=resume")
    d = tmp_path / "r" / "eval" / "resume"
    d.mkdir(parents=True)
    gold = {t.instance_id: t.patch for t in tasks_of(ids)}
    (d / "predictions.jsonl").write_text(
        json.dumps({"instance_id": done, "model_name_or_path": "tiny", "model_patch": gold[done]}) + "\n"
        + '{"instance_id": "' + todo + '", "model_na')  # the interrupted write
    engine = gold_engine(tokenizer, ids)
    with Served(engine, cfg) as s:
        out = run_eval(cfg, engine=s.engine, proxy=s.proxy)
        assert out.resolved_line == "resolved: 2/2 guarded, 2/2 official"
        from sao_harness.harness.store import read_traces

        assert [t.task_id for t in read_traces(d)] == [todo]  # the predicted instance got no episode
        calls = engine.calls
        preds = lines(d / "predictions.jsonl")
        assert [p["instance_id"] for p in preds] == [done, todo]
        capsys.readouterr()
        out = run_eval(cfg, engine=s.engine, proxy=s.proxy)
    printed = capsys.readouterr().out
    assert engine.calls == calls and "resume: 2/2 instance(s) already predicted" in printed
    assert "resume: 2 instance(s) already graded" in printed and "grading" not in printed.replace("graded", "")
    assert out.resolved_line == "resolved: 2/2 guarded, 2/2 official"
    assert len(lines(d / "grades.jsonl")) == 2 and len(lines(d / "predictions.jsonl")) == 2


def test_gold_preflight_stops_a_broken_environment(tmp_path, client, capsys):
    """A dataset whose 'gold' patch does not fix the task: the eval stops before any episode."""
    task = tasks_of(GOLD_IDS[:1])[0]
    row = task.to_row()
    row["patch"] = tasks_of(["sao-harness__semverkit-34"])[0].patch  # another task's fix: unresolved here
    ds = tmp_path / "broken.jsonl"
    ds.write_text(json.dumps(row) + "\n")
    rc = main(["eval", "--config", "configs/local.yaml", f"run.root={tmp_path}", f"eval.dataset={ds}", "--gold"])
    out = capsys.readouterr()
    assert rc == 2, out
    assert f"gold preflight: 1/1 gold patch(es) do not resolve: {task.instance_id}" in out.err
    assert not list(tmp_path.glob("local/eval/*/predictions.jsonl"))


def test_make_eval_path_with_the_tiny_model(tmp_path, client, capsys):
    """`sao eval --config configs/local.yaml` (what `make eval` runs), on one instance, short episodes."""
    rc = main(["eval", "--config", "configs/local.yaml", f"run.root={tmp_path}", "agent.max_iterations=2",
               "--instances", GOLD_IDS[0]])
    out = capsys.readouterr().out
    assert rc == 0, out
    d = tmp_path / "local" / "eval" / "tiny.bundled"
    assert out.strip().splitlines()[-1] == "resolved: 0/1 guarded, 0/1 official"
    for name in ("predictions.jsonl", "report.json", "report.md", "report.html", "tiny.tiny.bundled.json"):
        assert (d / name).is_file(), name
    row = json.loads((d / "report.json").read_text())["instances"][0]
    assert row["turns"] >= 1 and row["tokens"] > 0 and row["episode_status"] in (Status.OK, Status.TRUNCATED_TURNS)


def test_grade_cli_bad_predictions_lines(tmp_path, client, capsys):
    """A predictions file with bad lines: one clear error per line, the good line still graded."""
    t = tasks_of(GOLD_IDS[:1])[0]
    f = tmp_path / "preds.jsonl"
    f.write_text("\n".join([
        json.dumps({"instance_id": t.instance_id, "model_name_or_path": "m", "model_patch": t.patch}),
        json.dumps({"instance_id": t.instance_id, "model_patch": ""}),
        json.dumps({"instance_id": "nobody__nothing-1", "model_name_or_path": "m", "model_patch": ""}),
        json.dumps({"instance_id": GOLD_IDS[1], "model_name_or_path": "m", "model_patch": "I fixed it"}),
    ]) + "\n")
    rc = main(["eval", "grade", "--dataset", "bundled", "--predictions", str(f), f"run.root={tmp_path}"])
    out = capsys.readouterr().out
    assert rc == 1
    assert f"error: {f}:2: missing field 'model_name_or_path'" in out
    assert f"error: {f}:3: unknown instance 'nobody__nothing-1'" in out
    assert f"error: {f}:4: instance {GOLD_IDS[1]}: field 'model_patch' is not valid patch text" in out
    assert out.strip().splitlines()[-1] == "resolved: 1/1 guarded, 1/1 official"


def test_missing_task_images_are_built_before_the_episodes(tmp_path, client, tokenizer):
    """A task repo whose image does not exist yet: `sao eval` builds it itself (a fresh machine)."""
    import shutil
    import uuid

    import yaml

    from sao_harness.eval.run import run_eval

    src = Path("tasks/bundled")
    iid = f"sao-evaltest__minicfg-{uuid.uuid4().hex[:8]}"
    image = f"sao-evaltest/{iid.split('__')[1]}:latest"
    repo = tmp_path / "repo"
    (repo / "tasks").mkdir(parents=True)
    shutil.copy(src / "sweb.yaml", repo / "sweb.yaml")
    shutil.copytree(src / "tasks" / GOLD_IDS[0], repo / "tasks" / iid)
    meta = yaml.safe_load((repo / "tasks" / iid / "task.yaml").read_text())
    meta.update(instance_id=iid, image=image)
    (repo / "tasks" / iid / "task.yaml").write_text(yaml.safe_dump(meta))
    cfg = config(tmp_path, f"eval.dataset={repo}")
    try:
        from sao_harness.tasks.formats.loaders import load_tasks

        with Served(empty_engine(tokenizer, load_tasks(str(repo))), cfg) as s:
            out = run_eval(cfg, engine=s.engine, proxy=s.proxy)
        client.images.get(image)  # built
        assert out.resolved_line == "resolved: 0/1 guarded, 0/1 official" and out.report["verdicts"] == {"empty": 1}
    finally:
        try:
            client.images.remove(image, force=True)
        except Exception:
            pass
