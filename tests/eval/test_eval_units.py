"""`sao eval` without Docker: predictions files, resume bookkeeping, policy resolution, the eval run's
config, fail-fast on an unreachable dataset, the report files and `sao eval compare`."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from sao_harness.core.errors import UserError
from sao_harness.harness.trace import Status
from sao_harness.sao.cli import main
from sao_harness.tasks.grading.grade_status import INFRA_FAILURES
from tests.support.eval_data import IDS, synthetic_eval


def cli(capsys, *argv) -> tuple[int, str]:
    rc = main(list(argv))
    cap = capsys.readouterr()
    return rc, cap.out + cap.err


@pytest.fixture(scope="module")
def bundled():
    from sao_harness.tasks.formats.loaders import load_tasks

    return {t.instance_id: t for t in load_tasks("bundled", instances=IDS)}


# --- predictions and resume files ----------------------------------------------------------
def test_jsonl_log_keeps_whole_lines_only(tmp_path):
    from sao_harness.eval.paths import JsonlLog

    log = JsonlLog(tmp_path / "p.jsonl")
    log.append({"instance_id": "a", "x": 1})
    log.append({"instance_id": "b", "x": "é\nline"})
    with open(log.path, "ab") as f:
        f.write(b'{"instance_id": "c", "x"')  # a crash mid-write
    assert [r["instance_id"] for r in log.read()] == ["a", "b"]
    assert log.path.read_bytes().endswith(b"}\n")  # the torn fragment is gone
    log.append({"instance_id": "c"})
    assert [r["instance_id"] for r in log.read()] == ["a", "b", "c"]


def test_bad_predictions_file_one_error_per_line(tmp_path, bundled):
    from sao_harness.eval.cli import read_predictions

    t = bundled[IDS[0]]
    lines = [
        json.dumps({"instance_id": IDS[0], "model_name_or_path": "m", "model_patch": t.patch}),
        json.dumps({"instance_id": IDS[1], "model_patch": ""}),
        json.dumps({"instance_id": "nobody__nothing-1", "model_name_or_path": "m", "model_patch": ""}),
        json.dumps({"instance_id": IDS[2], "model_name_or_path": "m", "model_patch": "I fixed it"}),
        "{not json",
        json.dumps({"instance_id": IDS[3], "model_name_or_path": "m", "model_patch": ""}),
    ]
    f = tmp_path / "preds.jsonl"
    f.write_text("\n".join(lines) + "\n")
    preds, errors = read_predictions(str(f), bundled)
    assert [p["instance_id"] for p in preds] == [IDS[0], IDS[3]]  # the good lines survive the bad ones
    assert errors == [
        f"{f}:2: missing field 'model_name_or_path'",
        f"{f}:3: unknown instance 'nobody__nothing-1' (not in the dataset)",
        errors[2],
        errors[3],
    ]
    assert errors[2].startswith(f"{f}:4: instance {IDS[2]}: field 'model_patch' is not valid patch text")
    assert errors[3].startswith(f"{f}:5: not valid JSON")


# --- the policy and the eval run's config --------------------------------------------------
def _model_dir(p: Path, tokenizer: bool = True) -> Path:
    p.mkdir(parents=True)
    (p / "config.json").write_text("{}")
    if tokenizer:
        (p / "tokenizer.json").write_text("{}")
    return p


def test_resolve_policy(tmp_path):
    from sao_harness.eval.policy import resolve_policy
    from sao_harness.sao.config import load_config

    run = [f"run.root={tmp_path}", "run.name=r"]
    for step in ("step-2", "step-10", "step-9", ".tmp-step-000011-99"):  # a hidden one is being written
        _model_dir(tmp_path / "r" / "checkpoints" / step / "policy")
    pol = resolve_policy(load_config(None, run + ["eval.checkpoint=latest"]))
    assert pol.model_path == str(tmp_path / "r" / "checkpoints" / "step-10" / "policy")
    assert pol.model_name == "r-step-10" and pol.tag == "step-10"
    (tmp_path / "r" / "checkpoints" / "latest").write_text("step-9\n")  # the trainer's pointer wins
    assert resolve_policy(load_config(None, run + ["eval.checkpoint=latest"])).tag == "step-9"
    ck = tmp_path / "r" / "checkpoints" / "step-2"
    assert resolve_policy(load_config(None, run + [f"eval.checkpoint={ck}"])).model_path == str(ck / "policy")
    assert resolve_policy(load_config(None, run + [f"eval.checkpoint={ck / 'policy'}"])).tag == "step-2"
    hf = resolve_policy(load_config(None, run + ["eval.checkpoint=Qwen/Qwen3-8B"]))
    assert (hf.model_path, hf.model_name, hf.tag) == ("Qwen/Qwen3-8B", "Qwen/Qwen3-8B", "Qwen3-8B")
    _model_dir(tmp_path / "notok", tokenizer=False)
    with pytest.raises(UserError, match="has no tokenizer"):
        resolve_policy(load_config(None, run + [f"eval.checkpoint={tmp_path / 'notok'}"]))
    with pytest.raises(UserError, match="not found"):
        resolve_policy(load_config(None, run + [f"eval.checkpoint={tmp_path / 'nope'}"]))
    with pytest.raises(UserError, match="no checkpoint"):
        resolve_policy(load_config(None, [f"run.root={tmp_path}", "run.name=empty", "eval.checkpoint=latest"]))


def test_resolve_checkpoint_one_rule_for_resume_and_eval(tmp_path):
    """`latest`: the pointer when the checkpoint it names holds what the caller reads, else the highest
    step (numerically) that does; trainer resume needs state.json, eval and the demo policy/config.json."""
    from sao_harness.trainer.dist.checkpoint import (
        POLICY_CONFIG,
        STATE,
        latest_checkpoint,
        resolve_checkpoint,
    )

    root = tmp_path / "checkpoints"
    assert resolve_checkpoint("latest", tmp_path) is None and resolve_checkpoint("latest", tmp_path / "x") is None
    for step in (9, 10):
        _model_dir(root / f"step-{step}" / "policy")
        (root / f"step-{step}" / STATE).write_text("{}")
    _model_dir(root / "step-11" / "policy")  # no state.json: servable, not resumable
    (root / "step-12").mkdir()
    (root / "step-12" / STATE).write_text("{}")  # no policy: resumable, not servable
    assert resolve_checkpoint("latest", tmp_path) == root / "step-12" == latest_checkpoint(tmp_path)
    assert resolve_checkpoint("latest", tmp_path, need=POLICY_CONFIG) == root / "step-11"
    (root / "latest").write_text("step-9\n")
    assert resolve_checkpoint("latest", tmp_path) == root / "step-9"
    assert resolve_checkpoint("latest", tmp_path, need=POLICY_CONFIG) == root / "step-9"
    (root / "latest").write_text("step-12\n")  # names one without a policy: eval falls back
    assert resolve_checkpoint("latest", tmp_path, need=POLICY_CONFIG) == root / "step-11"
    assert resolve_checkpoint(str(root / "step-10"), tmp_path) == root / "step-10"


def test_eval_sampling_overrides_the_rollout_sampling(tmp_path):
    from sao_harness.eval.run import eval_run_config
    from sao_harness.sao.config import load_config

    cfg = load_config("configs/local.yaml", [f"run.root={tmp_path}", "run.name=r", "sampling.temperature=0.7",
                                             "eval.temperature=0", "eval.top_p=0.9", "eval.workers=3",
                                             "eval.dataset=/data/rows.jsonl"])
    rc = eval_run_config(cfg, name="ev", model_path="/m")
    assert (rc.sampling.temperature, rc.sampling.top_p) == (0.0, 0.9)
    assert rc.sampling.max_tokens == cfg.sampling.max_tokens
    assert rc.run.dir == tmp_path / "r" / "eval" / "ev"
    assert (rc.tasks.source, rc.model.path) == ("/data/rows.jsonl", "/m")
    assert rc.tasks.instances == []  # the task list goes down as list[Task] (select_tasks), never in a config
    assert rc.rollout.workers == 3 and cfg.sampling.temperature == 0.7  # the caller's config is untouched


def test_cli_parses_overrides_and_flags_in_any_order():
    from sao_harness.sao.cli import build_parser

    a = build_parser().parse_args(["eval", "--config", "c.yaml", "eval.temperature=0.5", "--gold", "--instances",
                                   "A", "B", "run.name=x", "--checkpoint", "latest"])
    assert a.func.__name__ == "cmd_agent_eval"
    assert (a.config, a.gold, a.instances, a.checkpoint) == ("c.yaml", True, ["A", "B"], "latest")
    assert a.overrides == ["eval.temperature=0.5"] and a.late_overrides == ["run.name=x"]
    a = build_parser().parse_args(["eval", "compare", "X", "Y"])
    assert (a.func.__name__, a.a, a.b, a.takes_config) == ("cmd_compare", "X", "Y", False)
    a = build_parser().parse_args(["eval", "grade", "--predictions", "gold", "run.name=z"])
    assert a.func.__name__ == "cmd_grade" and a.overrides == ["run.name=z"]


@pytest.mark.parametrize("offline", [False, True])
def test_swe_bench_verified_fails_fast_offline(tmp_path, capsys, monkeypatch, offline):
    """No hub here: a clear one-line error in seconds, before any image, engine or episode."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.monotonic()
    rc, out = cli(capsys, "eval", "--config", "configs/local.yaml", f"run.root={tmp_path}",
                  "eval.dataset=SWE-bench/SWE-bench_Verified")
    assert rc == 2 and time.monotonic() - t0 < 30
    assert "SWE-bench/SWE-bench_Verified" in out and "unreachable" in out and "Traceback" not in out
    assert not (tmp_path / "local" / "eval").exists()


def test_unknown_instance_is_a_clear_error(tmp_path, capsys):
    rc, out = cli(capsys, "eval", "--config", "configs/local.yaml", f"run.root={tmp_path}",
                  "--instances", "nobody__nothing-1")
    assert rc == 2 and "nobody__nothing-1" in out and "Traceback" not in out


# --- the report and compare ----------------------------------------------------------------
def test_report_files(tmp_path, bundled):
    d = tmp_path / "ev"
    r = synthetic_eval(d, bundled, {IDS[0], IDS[2]}, infra={IDS[3]}, hack={IDS[1]})
    assert (r["total"], r["resolved_guarded"], r["resolved_official"]) == (4, 2, 3)
    assert r["resolved_rate_guarded"] == 0.5 and r["hacking_attempts"] == {IDS[1]: 1}
    assert r["resolved_only_officially"] == [IDS[1]] and list(r[INFRA_FAILURES]) == [IDS[3]]
    assert r["by_repo"]["sao-harness/minicfg"] == {"total": 1, "resolved": 1, "resolved_official": 1,
                                                   INFRA_FAILURES: 0, "rate": 1.0, "rate_official": 1.0}
    assert list(r["by_difficulty"]) == ["easy", "medium", "hard"]
    row = r["instances"][0]
    assert {k: row[k] for k in ("instance_id", "resolved", "turns", "tokens", "episode_status", "seconds")} == \
        {"instance_id": IDS[0], "resolved": True, "turns": 3, "tokens": 9000, "episode_status": Status.OK,
         "seconds": 10.0}
    assert json.loads((d / "report.json").read_text())["instances"] == r["instances"]
    for png in ("turns.png", "tokens.png", "difficulty.png"):
        assert (d / "plots" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (d / "report.md").read_text()
    assert f"| {IDS[0]} | sao-harness/minicfg | easy | resolved |" in md and "![turns.png](plots/turns.png)" in md
    html = (d / "report.html").read_text()
    assert html.count('<img alt="') == 3 and html.count('src="data:image/png;base64,') == 3
    assert f"<td>{IDS[2]}</td>" in html and "<td>sao-harness/tablefmt</td>" in html
    assert "http://" not in html and "https://" not in html and "<script" not in html and "<link" not in html


def test_compare(tmp_path, bundled, capsys):
    a, b = tmp_path / "runA" / "eval" / "before", tmp_path / "after"
    synthetic_eval(a, bundled, {IDS[0], IDS[1]}, name="before")
    synthetic_eval(b, {k: v for k, v in bundled.items() if k != IDS[3]}, {IDS[0], IDS[2]}, name="after")
    from sao_harness.eval.compare import compare

    res = compare(tmp_path / "runA", b / "report.json")  # a run dir (its newest eval) and a report file
    assert res["counts"] == {"newly_resolved": 1, "newly_failed": 1, "unchanged_resolved": 1,
                             "unchanged_unresolved": 0, "only_in_a": 1, "only_in_b": 0}
    assert res["a"]["shared_rate_guarded"] == res["b"]["shared_rate_guarded"] == pytest.approx(2 / 3, abs=1e-3)
    rc, out = cli(capsys, "eval", "compare", str(a), str(b))
    assert rc == 0
    assert f"newly resolved (1):\n  {IDS[2]}" in out and f"newly failed (1):\n  {IDS[1]}" in out
    assert "resolved rate (guarded, whole runs): 50.0% of 4 -> 66.7% of 3" in out
    rc, out = cli(capsys, "eval", "compare", str(a), str(tmp_path / "nothing"))
    assert rc == 2 and "no evaluation report" in out


def test_stored_trajectory_without_prediction_is_reconciled(tmp_path):
    """A crash between the trace write and the prediction line: the next start writes the prediction."""
    from sao_harness.eval.paths import EvalPaths, JsonlLog
    from sao_harness.eval.predict import reconcile
    from sao_harness.harness.store import TraceStore
    from sao_harness.harness.trace import Trajectory

    paths = EvalPaths(tmp_path / "ev")
    store = TraceStore(paths.dir)
    store.write([Trajectory(task_id=IDS[0], status=Status.OK, turns=2, patch="diff --git a/x b/x\n")])
    store.write([Trajectory(task_id=IDS[1], status=Status.INFRA_ERROR)])  # no verdict: redone, not predicted
    preds = {}
    preds_log, episodes = JsonlLog(paths.predictions), JsonlLog(paths.episodes)
    assert reconcile(paths, "m", set(IDS), preds, episodes, preds_log, log=lambda *_: None) == 1
    assert preds_log.read() == [{"instance_id": IDS[0], "model_name_or_path": "m",
                                 "model_patch": "diff --git a/x b/x\n"}]
    assert episodes.read()[0]["turns"] == 2 and list(preds) == [IDS[0]]
    assert reconcile(paths, "m", set(IDS), preds, episodes, preds_log, log=lambda *_: None) == 0


def test_context_budget_end_is_truncated_context_not_infra():
    """The proxy's over-budget answer ends the episode as truncated_context (graded), not infra_error."""
    from types import SimpleNamespace

    from sao_harness.harness.agent import AgentResult, ErrorKind, classify_error
    from sao_harness.harness.episode import _status
    from sao_harness.harness.trace import Trajectory

    over = RuntimeError("litellm.BadRequestError: OpenAIException - context_length_exceeded: prompt is 16820 "
                        "tokens, the context budget (proxy.context_budget) is 16384: ...")
    assert classify_error(over) == ErrorKind.CONTEXT
    assert classify_error(ConnectionError("proxy unreachable")) != ErrorKind.CONTEXT
    result = AgentResult(finished=False, iterations=3, nudges=0, hit_max_iterations=False, error=str(over),
                         error_kind=ErrorKind.CONTEXT)
    assert result.status == Status.TRUNCATED_CONTEXT
    truncated = Trajectory(task_id="t", status=Status.TRUNCATED_CONTEXT)
    assert _status(result, truncated, None) == Status.TRUNCATED_CONTEXT
    assert _status(result, truncated, "SandboxError: gone") == Status.INFRA_ERROR
    dead = SimpleNamespace(status=Status.INFRA_ERROR, error="SandboxUnavailable: container exited")
    assert _status(dead, truncated, None) == Status.INFRA_ERROR


def test_a_mixed_source_is_reported_per_dataset(tmp_path):
    """A comma-separated eval.dataset mixes datasets (each task knows its part): the overall report is as
    for one dataset, plus each dataset's resolved rates and its own swebench summary (synthetic verdicts)."""
    from sao_harness.eval.grading import dataset_reports
    from sao_harness.eval.report import write_report
    from sao_harness.tasks.formats.loaders import load_tasks_lenient

    fixtures = Path(__file__).parent.parent / "tasks" / "fixtures" / "datasets"
    gym, rebench = str(fixtures / "swe_gym.jsonl"), str(fixtures / "swe_rebench.jsonl")
    mixed = f"bundled,{gym},{rebench}"
    tasks, errors = load_tasks_lenient(mixed, instances=[IDS[0], IDS[1], "getmoto__moto-7365",
                                                         "0b01001001__spectree-64"])
    assert errors == [] and [(t.source, t.adapter) for t in tasks] == [
        ("bundled", "swebench"), ("bundled", "swebench"), (gym, "swe-gym"), (rebench, "swe-rebench")]
    resolved = {IDS[0], "getmoto__moto-7365"}
    run_id, logs = "ev", tmp_path / "logs"
    preds = {t.instance_id: {"instance_id": t.instance_id, "model_name_or_path": "m", "model_patch": "diff"}
             for t in tasks}
    for iid in preds:  # what swebench's run_instance leaves: one report per graded instance
        (logs / run_id / "m" / iid).mkdir(parents=True)
        (logs / run_id / "m" / iid / "report.json").write_text(json.dumps({iid: {"resolved": iid in resolved}}))
    grades = {iid: {"instance_id": iid, "status": "resolved" if iid in resolved else "unresolved",
                    "official_status": "resolved" if iid in resolved or iid == IDS[1] else "unresolved",
                    "resolved_guarded": iid in resolved, "resolved_official": iid in resolved or iid == IDS[1]}
              for iid in preds}
    per = dataset_reports(preds, tasks, run_id, log_root=logs, out_dir=tmp_path / "ev", default=mixed)
    assert list(per) == ["bundled", gym, rebench]
    summaries = {name: json.loads(Path(path).read_text()) for name, path in per.items()}
    assert Path(per["bundled"]).parent == tmp_path / "ev" / "datasets" / "bundled"
    assert {n: (s["total_instances"], s["submitted_instances"], s["resolved_ids"]) for n, s in summaries.items()} == {
        "bundled": (2, 2, [IDS[0]]), gym: (1, 1, ["getmoto__moto-7365"]), rebench: (1, 1, [])}
    manifest = {"name": "ev", "model_name_or_path": "m", "dataset": mixed, "split": "test", "guard": True}
    report, files = write_report(tmp_path / "ev", tasks=tasks, preds=preds, grades=grades, episodes={},
                                 manifest=manifest, swebench_summary=None, dataset_reports=per)
    assert (report["total"], report["resolved_guarded"], report["resolved_official"]) == (4, 2, 3)  # as before
    assert {n: (d["total"], d["resolved"], d["rate"], d["resolved_official"], d["formats"])
            for n, d in report["by_dataset"].items()} == {
        "bundled": (2, 1, 0.5, 2, ["swebench"]), gym: (1, 1, 1.0, 1, ["swe-gym"]),
        rebench: (1, 0, 0.0, 0, ["swe-rebench"])}
    assert files["swebench[bundled]"] == per["bundled"] and files[f"swebench[{gym}]"] == per[gym]
    md = (tmp_path / "ev" / "report.md").read_text()
    assert f"| bundled | swebench | 2 | 1 | 50.0% | 2 | 100.0% | 0 | {per['bundled']} |" in md
    assert "<h2>Per dataset</h2>" in (tmp_path / "ev" / "report.html").read_text()
    single = write_report(tmp_path / "one", tasks=tasks[:2], preds=preds, grades=grades, episodes={},
                          manifest=manifest, swebench_summary=None)[0]
    assert list(single["by_dataset"]) == ["bundled"]  # one dataset: no per-dataset section or summaries
    assert "Per dataset" not in (tmp_path / "one" / "report.md").read_text()
    assert dataset_reports(preds, tasks[:2], run_id, log_root=logs, out_dir=tmp_path / "one", default=mixed) == {}
