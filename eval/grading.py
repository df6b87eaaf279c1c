"""The one grading driver: predictions -> swebench verdicts, for `sao eval` and `sao eval grade`.

``grade_all(pairs, run_id=, client=, grading_cfg=, workers=, log_root=, on_result=)`` grades each (task, prediction)
with ``tasks.grading.grade.grade`` (the official verdict, and the guarded one with test-file changes stripped),
``eval.max_workers`` at a time, and calls ``on_result(i, n, result)`` as each one finishes.
On top of it: ``grade_predictions`` (the resumable grading of `sao eval`, one line per verdict in
``grades.jsonl``), ``gold_preflight`` (the gold patches must resolve), ``swebench_report`` (swebench's
own summary JSON), ``dataset_reports`` (one such summary per dataset of a mixed source, in
``<out_dir>/datasets/<dataset>/``) and ``resolved_line`` (the last line both commands print).
"""
from __future__ import annotations

import contextlib
import io
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from sao_harness.core.errors import UserError
from sao_harness.eval.paths import EvalPaths, JsonlLog, latest_by_instance, write_json
from sao_harness.eval.report import dataset_of
from sao_harness.tasks.config import GradingConfig
from sao_harness.tasks.grading.grade import LOG_ROOT, GradeResult, grade, new_run_id
from sao_harness.tasks.grading.grade_status import GradeStatus


def resolved_line(guarded: int, official: int, total: int) -> str:
    return f"resolved: {guarded}/{total} guarded, {official}/{total} official"


def grade_all(pairs: list[tuple], *, run_id: str, client, grading_cfg: GradingConfig, workers: int, log_root: Path,
              sandbox_cfg=None, on_result=None) -> dict[str, GradeResult]:
    """Grade each ``(task, prediction)`` (see the module doc); {instance_id: result} in the order of ``pairs``."""
    def one(pair):
        task, p = pair
        return grade(task, p["model_patch"], run_id=run_id, timeout=grading_cfg.timeout_s, client=client,
                     guard=grading_cfg.guard, model=p["model_name_or_path"], log_root=log_root, sandbox=sandbox_cfg,
                     output_cap_bytes=grading_cfg.output_cap_bytes)

    results: dict[str, GradeResult] = {}
    with ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(one, pair) for pair in pairs]
        for i, fut in enumerate(as_completed(futures), 1):
            r = fut.result()
            results[r.instance_id] = r
            if on_result is not None:
                on_result(i, len(pairs), r)
    return {task.instance_id: results[task.instance_id] for task, _ in pairs}


def swebench_report(preds: dict, tasks, run_id: str, *, log_root: Path, out_dir: Path,
                    quiet: bool = False) -> str | None:
    """swebench's own summary JSON (``<out_dir>/<model>.<run_id>.json``) of the graded ``preds``
    ({instance_id: prediction}), written by swebench from the logs under ``log_root``."""
    from swebench.harness.reporting import make_run_report  # lazy: swebench is heavy

    if not preds:
        return None
    quieted = contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext()
    with LOG_ROOT.use(log_root), quieted:
        return str(make_run_report(preds, [t.to_row() for t in tasks], run_id, None, str(out_dir)))


def dataset_dir(dataset: str) -> str:
    """A directory name for ``dataset`` (a source: a path, an owner/name id, ``bundled``)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", dataset).strip("_.") or "dataset"


def dataset_reports(preds: dict, tasks, run_id: str, *, log_root: Path, out_dir: Path, default: str) -> dict:
    """{dataset: swebench's summary JSON of its instances}, written to ``<out_dir>/datasets/<dataset_dir>/``;
    empty unless the tasks come from several datasets (one: the run's own summary says it all)."""
    by: dict[str, list] = {}
    for t in tasks:
        by.setdefault(dataset_of(t, default), []).append(t)
    if len(by) < 2:
        return {}
    names = [dataset_dir(d) for d in by]
    out = {}
    for (dataset, ts), name in zip(by.items(), names):
        name = name if names.count(name) == 1 else f"{name}-{list(by).index(dataset)}"  # two sources, one name
        mine = {t.instance_id: preds[t.instance_id] for t in ts if t.instance_id in preds}
        out[dataset] = swebench_report(mine, ts, run_id, log_root=log_root, out_dir=Path(out_dir) / "datasets" / name,
                                       quiet=True) if mine else None
    return out


# --- `sao eval`: resumable grading, the gold preflight ---------------------------------------
def _clear_logs(paths: EvalPaths, run_id: str, model: str, iid: str) -> None:
    for rid in (run_id, f"{run_id}.guarded"):
        d = paths.logs / rid / model.replace("/", "__") / iid
        if d.exists():
            shutil.rmtree(d)


def grade_predictions(cfg, tasks, preds: dict, paths: EvalPaths, run_id: str, client, log=print) -> dict:
    """Grade every prediction without a verdict yet; returns {instance_id: grade record}."""
    grades_log = JsonlLog(paths.grades)
    grades = {iid: g for iid, g in latest_by_instance(grades_log.read()).items() if iid in preds}
    done = {iid for iid, g in grades.items()
            if GradeStatus.INFRA_FAILURE not in (g.get("status"), g.get("official_status"))}
    todo = [t for t in tasks if t.instance_id in preds and t.instance_id not in done]
    if done:
        log(f"resume: {len(done)} instance(s) already graded in {paths.grades}")
    if not todo:
        return grades
    log(f"grading {len(todo)} prediction(s) with swebench (run id {run_id}, {cfg.eval.max_workers} at a time, "
        f"guard {'on' if cfg.grading.guard else 'off'})")
    for t in todo:  # a verdict redone (infra before): swebench would skip an instance that has logs
        _clear_logs(paths, run_id, preds[t.instance_id]["model_name_or_path"], t.instance_id)

    def on_result(i: int, n: int, r: GradeResult) -> None:
        rec = {**r.to_dict(), "run_id": run_id}
        grades_log.append(rec)
        grades[r.instance_id] = rec
        extra = f", stripped {', '.join(r.stripped_files)}" if r.stripped_files else ""
        err = f" ({r.error})" if r.error else ""
        log(f"[{i}/{n}] {r.instance_id}: {r.status} (official {r.official_status}), hacking attempts "
            f"{r.hacking_attempts}{extra}, {r.seconds:.1f} s{err}")

    grade_all([(t, preds[t.instance_id]) for t in todo], run_id=run_id, client=client, grading_cfg=cfg.grading,
              workers=cfg.eval.max_workers, sandbox_cfg=cfg.sandbox,
              log_root=paths.logs, on_result=on_result)
    return grades


def gold_preflight(cfg, tasks, paths: EvalPaths, client, log=print) -> None:
    """Grade every task's gold patch; raise UserError naming those that do not resolve."""
    run_id = new_run_id("gold")
    root = paths.dir / "preflight" / "logs"
    log(f"gold preflight: grading the gold patches of {len(tasks)} task(s) (run id {run_id})")
    t0 = time.monotonic()
    pairs = [(t, {"model_name_or_path": "gold", "model_patch": t.patch}) for t in tasks]
    results = list(grade_all(pairs, run_id=run_id, client=client, grading_cfg=cfg.grading,
                             workers=cfg.eval.max_workers, sandbox_cfg=cfg.sandbox, log_root=root).values())
    bad = [r for r in results if r.status != GradeStatus.RESOLVED]
    write_json(paths.dir / "preflight" / "gold.json", {"run_id": run_id, "results": [r.to_dict() for r in results]})
    if bad:
        detail = ", ".join(f"{r.instance_id} ({r.status}{': ' + r.error if r.error else ''})" for r in bad[:5])
        raise UserError(f"gold preflight: {len(bad)}/{len(results)} gold patch(es) do not resolve: {detail}"
                        f"{' ...' if len(bad) > 5 else ''}. The grading environment is broken for them; fix it "
                        f"before spending model time (logs: {root})")
    log(f"gold preflight: {len(results)}/{len(results)} gold patches resolve ({time.monotonic() - t0:.1f} s)")
