"""`sao eval ...`: evaluate a policy, grade predictions, compare evaluations.

- ``sao eval [--config F] [--gold] [--instances ID...] [--checkpoint DIR|ID|latest] [--name NAME]
  [key.sub=value ...]``: the agent of a checkpoint (default ``model.path``) on ``eval.dataset`` with
  ``eval.temperature``/``eval.top_p``; writes ``<run.dir>/eval/<name>/``: ``predictions.jsonl``
  (SWE-bench format), the trace store, swebench's summary JSON, ``report.json|md|html``; resumable
  (``eval.run``). ``--gold`` grades the gold patches first and stops if one does not resolve. The last
  line is ``resolved: N/M guarded, K/M official``; exit 1 when an instance has no verdict (infra).
- ``sao eval grade --dataset FILE --predictions FILE.jsonl|gold [--run-id ID] [--instances ID...]``:
  grade predictions against any swebench 5.x dataset (jsonl / parquet / task-repo dir / ``bundled``)
  whose images exist locally, with the official harness; official and guarded verdicts. Writes
  swebench's summary JSON (``<run_dir>/<model>.<run_id>.json``, untouched) and ours
  (``<run_dir>/grade.json``); the last line is ``resolved: N/M guarded, K/M official``.
- ``sao eval compare A B [--json]``: instance by instance, what changed between two evaluations.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from sao_harness.core.errors import UserError
from sao_harness.core.files import atomic_write_text
from sao_harness.tasks.cli import IdsAction
from sao_harness.tasks.grading.grade_status import INFRA_FAILURES, GradeStatus


def cmd_agent_eval(args) -> int:
    cfg = args.cfg
    for flag, key in (("checkpoint", "checkpoint"), ("name", "name")):
        if getattr(args, flag, None):
            setattr(cfg.eval, key, getattr(args, flag))
    if getattr(args, "gold", False):
        cfg.eval.gold_preflight = True
    if getattr(args, "instances", None):
        cfg.eval.instances = list(dict.fromkeys(args.instances))
    from sao_harness.eval.grading import resolved_line  # lazy: keep sao --help fast
    from sao_harness.eval.run import run_eval  # lazy: keep sao --help fast

    out = run_eval(cfg, log=lambda msg: print(msg, flush=True))
    r = out.report
    for kind, path in out.files.items():
        print(f"{kind}: {path}")
    if len(r.get("by_dataset") or {}) > 1:  # a mixed source: each dataset's rates
        for name, d in r["by_dataset"].items():
            print(f"dataset {name} ({', '.join(d['formats'])}): "
                  + resolved_line(d["resolved"], d["resolved_official"], d["total"]))
    if r["hacking_attempts"]:
        print(f"hacking attempts (test changes stripped before grading): "
              f"{', '.join(f'{k} ({v})' for k, v in r['hacking_attempts'].items())}")
    if r[INFRA_FAILURES]:
        print(f"no verdict (infrastructure failures, never a 0; rerun to retry): {', '.join(r[INFRA_FAILURES])}")
    print(out.resolved_line)
    sys.stdout.flush()
    return 1 if r[INFRA_FAILURES] else 0


def cmd_compare(args) -> int:
    from sao_harness.eval.compare import compare, render  # lazy: keep sao --help fast

    result = compare(args.a, args.b)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(render(result))
    return 0


def read_predictions(path: str, tasks_by_id: dict) -> tuple[list[dict], list[str]]:
    """(valid predictions, one error line per bad prediction line)."""
    from sao_harness.tasks.grading.guard import InvalidPatch, parse_patch  # lazy: keep sao --help fast

    p = Path(path)
    if not p.is_file():
        raise UserError(f"predictions file not found: {p}")
    if p.suffix == ".json":
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise UserError(f"{p}: not valid JSON ({e.msg})") from None
        items = list(data.values()) if isinstance(data, dict) else data
        if not isinstance(items, list):
            raise UserError(f"{p}: expected a list of predictions")
        lines = [(i, item, None) for i, item in enumerate(items, 1)]
    else:
        lines = []
        for i, text in enumerate(p.read_text().splitlines(), 1):
            if not text.strip():
                continue
            try:
                lines.append((i, json.loads(text), None))
            except json.JSONDecodeError as e:
                lines.append((i, None, f"not valid JSON ({e.msg})"))
    preds, errors, seen = [], [], set()
    for n, item, err in lines:
        where = f"{p}:{n}"
        if err is None and not isinstance(item, dict):
            err = f"a prediction must be a JSON object, got {type(item).__name__}"
        if err is None:
            iid = item.get("instance_id")
            missing = [k for k in ("instance_id", "model_name_or_path", "model_patch") if k not in item]
            if missing:
                err = f"missing field {', '.join(repr(m) for m in missing)}"
            elif not isinstance(iid, str) or iid not in tasks_by_id:
                err = f"unknown instance {iid!r} (not in the dataset)"
            elif item["model_patch"] is not None and not isinstance(item["model_patch"], str):
                err = f"instance {iid}: field 'model_patch' must be a string, got {type(item['model_patch']).__name__}"
            else:
                try:
                    parse_patch(item["model_patch"] or "")
                except InvalidPatch as e:
                    err = f"instance {iid}: field 'model_patch' is not valid patch text: {e}"
            if err is None and iid in seen:
                err = f"instance {iid} predicted twice (only the first is graded)"
        if err:
            errors.append(f"{where}: {err}")
            continue
        seen.add(item["instance_id"])
        preds.append({"instance_id": item["instance_id"], "model_name_or_path": str(item["model_name_or_path"]),
                      "model_patch": item["model_patch"] or ""})
    return preds, errors


def _predictions(args, dataset: str, tasks: list, known: dict) -> tuple[list[dict], list[str]]:
    """The predictions `sao eval grade` grades (``gold``: each task's own patch), only ``--instances``
    when given, and the errors of the lines that could not be read."""
    if args.predictions == "gold":
        preds = [{"instance_id": t.instance_id, "model_name_or_path": "gold", "model_patch": t.patch} for t in tasks]
        line_errors = []
    else:
        preds, line_errors = read_predictions(args.predictions, known)
    if args.instances:
        unknown = [i for i in args.instances if i not in known]
        if unknown:
            raise UserError(f"--instances: not in {dataset}: {' '.join(unknown)}")
        preds = [p for p in preds if p["instance_id"] in set(args.instances)]
    return preds, line_errors


def _gradable(preds: list[dict], tasks_by_id: dict, bad_by_id: dict, client, image_exists) -> tuple[list, dict]:
    """(task, prediction) pairs that can be graded here, and why each other instance cannot."""
    instance_errors: dict[str, str] = {}
    todo = []
    for p in preds:
        iid = p["instance_id"]
        task = tasks_by_id.get(iid)
        if task is None:
            instance_errors[iid] = str(bad_by_id[iid])
        elif not task.gradable:
            instance_errors[iid] = f"task {iid}: not gradable here: " + "; ".join(task.grading_gaps() + task.notes)
        elif not image_exists(client, task.image):
            instance_errors[iid] = (f"task {iid}: image {task.image} not found locally (build it: "
                                    "sao tasks build --task-repo DIR)")
        else:
            todo.append((task, p))
    return todo, instance_errors


def cmd_grade(args) -> int:
    from sao_harness.envs.engine import ensure_engine  # lazy: keep sao --help fast
    from sao_harness.envs.images import image_exists  # lazy: keep sao --help fast
    from sao_harness.eval.grading import (  # lazy: keep sao --help fast
        grade_all,
        resolved_line,
        swebench_report,
    )
    from sao_harness.tasks.formats.loaders import load_tasks_lenient  # lazy: keep sao --help fast
    from sao_harness.tasks.grading.grade import RUN_ID_RE, new_run_id  # lazy: keep sao --help fast

    cfg = args.cfg
    dataset = args.dataset or cfg.eval.dataset
    tasks, bad_rows = load_tasks_lenient(dataset, split=cfg.eval.split, adapter="auto")
    bad_by_id = {e.instance_id: e for e in bad_rows}
    tasks_by_id = {t.instance_id: t for t in tasks}
    known = dict(tasks_by_id, **{k: None for k in bad_by_id if k})
    preds, line_errors = _predictions(args, dataset, tasks, known)
    run_id = args.run_id or new_run_id("grade")
    if not RUN_ID_RE.match(run_id):
        raise UserError(f"--run-id {run_id!r}: use letters, digits, '.', '_' and '-'")
    run_dir = Path(cfg.run.dir)
    log_root = run_dir / "logs" / "run_evaluation"
    if (log_root / run_id).exists() or (log_root / f"{run_id}.guarded").exists():
        raise UserError(f"--run-id {run_id}: {log_root / run_id} already exists (swebench would skip its "
                        "reported instances); pick a fresh run id")
    for msg in line_errors:
        print(f"error: {msg}")
    client = ensure_engine(cfg.docker)
    todo, instance_errors = _gradable(preds, tasks_by_id, bad_by_id, client, image_exists)
    for _iid, msg in instance_errors.items():
        print(f"error: {msg}")
    t0 = time.monotonic()
    print(f"grading {len(todo)} prediction(s) from {args.predictions} against {dataset} "
          f"(run id {run_id}, {cfg.eval.max_workers} at a time, guard {'on' if cfg.grading.guard else 'off'})",
          flush=True)

    def on_result(i: int, n: int, r) -> None:
        extra = f" stripped: {', '.join(r.stripped_files)}" if r.stripped_files else ""
        err = f" ({r.error})" if r.error else ""
        print(f"  {r.instance_id}: official {r.official_status}, guarded {r.status}, hacking attempts "
              f"{r.hacking_attempts}, {r.seconds:.1f} s{extra}{err}", flush=True)

    graded = grade_all(todo, run_id=run_id, client=client, grading_cfg=cfg.grading, workers=cfg.eval.max_workers,
                       sandbox_cfg=cfg.sandbox, log_root=log_root, on_result=on_result)
    results = {iid: r.to_dict() for iid, r in graded.items()}
    graded_preds = {p["instance_id"]: p for p in preds if p["instance_id"] in results}
    swebench = swebench_report(graded_preds, tasks, run_id, log_root=log_root, out_dir=run_dir)
    m = len(preds)
    n_guarded = sum(r["status"] == GradeStatus.RESOLVED for r in results.values())
    n_official = sum(r["official_status"] == GradeStatus.RESOLVED for r in results.values())
    infra = sorted(i for i, r in results.items() if GradeStatus.INFRA_FAILURE in (r["status"], r["official_status"]))
    summary = {
        "run_id": run_id, "dataset": dataset, "predictions": args.predictions, "guard": cfg.grading.guard,
        "swebench_report": swebench, "log_root": str(log_root), "seconds": round(time.monotonic() - t0, 2),
        "submitted": m, "graded": len(results), "resolved_guarded": n_guarded, "resolved_official": n_official,
        "hacking_attempts": {i: r["hacking_attempts"] for i, r in results.items() if r["hacking_attempts"]},
        INFRA_FAILURES: infra, "instance_errors": instance_errors, "line_errors": line_errors,
        "instances": results,
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    out = atomic_write_text(run_dir / "grade.json", json.dumps(summary, indent=2) + "\n")
    print(f"grade report: {out}" + (f"; swebench report: {swebench}" if swebench else ""))
    if infra:
        print(f"no verdict (infrastructure failures, never a reward): {', '.join(infra)}")
    print(resolved_line(n_guarded, n_official, m))
    sys.stdout.flush()
    return 1 if (line_errors or instance_errors or infra) else 0


class _Choices(dict):
    """Subcommand names, plus any ``key.sub=value``: an override where a subcommand could start."""

    def __contains__(self, key) -> bool:
        return super().__contains__(key) or (isinstance(key, str) and "=" in key)


class _EvalSubcommands(argparse._SubParsersAction):
    """``sao eval grade|compare ...`` as usual; ``sao eval [opts] key=value [opts]`` is the agent eval."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self._name_parser_map = self.choices = _Choices()

    def __call__(self, parser, namespace, values, option_string=None):
        if values and dict.__contains__(self._name_parser_map, values[0]):
            return super().__call__(parser, namespace, values, option_string)
        rest = argparse.ArgumentParser(prog=f"{parser.prog}", argument_default=argparse.SUPPRESS, add_help=False)
        _agent_options(rest)
        rest.add_argument("overrides", nargs="*")
        sub = rest.parse_intermixed_args(values, namespace=argparse.Namespace(instances=None))
        for key, value in vars(sub).items():
            if value is None:
                continue
            if key in ("overrides", "late_overrides", "instances"):
                value = list(getattr(namespace, key, None) or []) + list(value)
            setattr(namespace, key, value)


def _agent_options(p) -> None:
    p.add_argument("--config", metavar="FILE.yaml", help="run config (default: configs/local.yaml when present)")
    p.add_argument("--gold", action="store_true", help="grade the gold patches first; stop if one does not resolve")
    p.add_argument("--instances", nargs="+", action=IdsAction, metavar="ID", help="evaluate only these instances")
    p.add_argument("--checkpoint", metavar="DIR|ID|latest",
                   help="trainer checkpoint, model dir or Hugging Face id (default: eval.checkpoint, else model.path)")
    p.add_argument("--name", metavar="NAME", help="eval directory name under <run>/eval (default: <model>.<dataset>)")


def register(sub, add_config_args):
    p = sub.add_parser("eval", help="evaluate a policy on a task set (agent + swebench), grade predictions, compare",
                       description="sao eval [--config F] [--gold] [--instances ID...] [key.sub=value ...]: run the "
                                   "agent and grade it; or a subcommand: grade, compare")
    _agent_options(p)
    p.set_defaults(func=cmd_agent_eval, takes_config=True, overrides=[])
    esub = p.add_subparsers(dest="eval_command", metavar="{grade,compare} | key.sub=value", action=_EvalSubcommands)

    q = esub.add_parser("grade", help="grade a predictions file with the official swebench harness (+ guard)")
    q.add_argument("--dataset", metavar="FILE", help="swebench 5.x dataset: .jsonl/.parquet, a task repo dir, "
                   "or 'bundled' (default: eval.dataset)")
    q.add_argument("--predictions", metavar="FILE.jsonl|gold", required=True,
                   help="predictions (instance_id, model_name_or_path, model_patch per line) or 'gold'")
    q.add_argument("--run-id", metavar="ID", help="swebench run id (default: a fresh one)")
    q.add_argument("--instances", nargs="+", action=IdsAction, metavar="ID", help="only these instance ids")
    add_config_args(q)
    q.set_defaults(func=cmd_grade)

    q = esub.add_parser("compare", help="what changed between two evaluations, instance by instance")
    q.add_argument("a", metavar="RUN_A", help="eval dir, its report.json, or a run dir (its newest eval)")
    q.add_argument("b", metavar="RUN_B", help="the same for the other run")
    q.add_argument("--json", action="store_true", help="machine-readable output")
    q.set_defaults(func=cmd_compare, takes_config=False)
