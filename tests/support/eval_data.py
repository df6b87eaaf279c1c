"""Four bundled task ids and a synthetic evaluation (report files as if graded) for the eval tests."""
from __future__ import annotations

from pathlib import Path

from sao_harness.eval.report import write_report
from sao_harness.harness.trace import Status
from sao_harness.tasks.grading.grade_status import GradeStatus

IDS = ["sao-harness__minicfg-11", "sao-harness__semverkit-31", "sao-harness__spanlib-24", "sao-harness__tablefmt-9"]


def synthetic_eval(eval_dir: Path, tasks: dict, resolved: set[str], *, name="ev", infra=(), hack=()) -> dict:
    """Write a report for ``tasks`` as if evaluated: ``resolved`` ids resolved, ``infra`` ids without a verdict."""
    preds, grades, episodes = {}, {}, {}
    for i, (iid, t) in enumerate(tasks.items()):
        episodes[iid] = {"instance_id": iid, "status": Status.INFRA_ERROR if iid in infra else Status.OK,
                         "turns": 3 + i, "tokens": 9000 + 700 * i, "action_tokens": 500 + 90 * i, "seconds": 10.0 + i}
        if iid in infra:
            continue
        preds[iid] = {"instance_id": iid, "model_name_or_path": "m", "model_patch": t.patch if iid in resolved else ""}
        ok = iid in resolved
        grades[iid] = {"instance_id": iid, "status": GradeStatus.RESOLVED if ok else GradeStatus.EMPTY,
                       "official_status": GradeStatus.RESOLVED if ok or iid in hack else GradeStatus.EMPTY,
                       "resolved_guarded": ok, "resolved_official": ok or iid in hack,
                       "hacking_attempts": 1 if iid in hack else 0,
                       "stripped_files": ["conftest.py"] if iid in hack else [], "seconds": 1.5, "error": ""}
    manifest = {"name": name, "model_name_or_path": "m", "model_path": "/m", "dataset": "bundled", "split": "test",
                "sampling": {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": 256}, "guard": True}
    report, _files = write_report(eval_dir, tasks=list(tasks.values()), preds=preds, grades=grades, episodes=episodes,
                                 manifest=manifest, swebench_summary=str(eval_dir / "m.ev.json"), seconds=12.0)
    return report
