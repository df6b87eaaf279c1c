"""`sao eval --config F`: the agent of a checkpoint on an evaluation set, graded by swebench.

``run_eval(cfg, *, instances=None, gold=None, engine=None, proxy=None, log=print) -> EvalOutcome``:
1. picks the policy (``eval.policy``) and the tasks (``eval.dataset``, ``eval.instances``: loaded and
   pre-flighted once per run, ``select_tasks``, and that list passed down); checks,
   before any episode, that the dataset is reachable (a hub id fails fast offline), the tasks are
   gradable and their images exist (``tasks.images``: a task repo's are built; official images pulled
   where a registry answers, else a clear error); optionally grades the gold patches first (``--gold``);
2. runs the episodes into ``<run.dir>/eval/<name>/traces`` and appends one SWE-bench prediction per
   instance to ``predictions.jsonl`` as soon as its episode ends (``eval.predict``);
3. grades each prediction (``eval.grading``: official + guarded verdicts), one line per instance in
   ``grades.jsonl``; writes swebench's summary JSON and the report (``eval.report``); a mixed
   ``eval.dataset`` (comma-separated sources) also gets one swebench summary per dataset
   (``<eval dir>/datasets/<dataset>/``) and per-dataset resolved rates in the report.
Resumable: an instance with a prediction is not run again, one with a verdict not graded again
(``eval.paths``: whole lines or nothing). A directory evaluated with other settings is refused.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from sao_harness.core.errors import UserError
from sao_harness.core.runlock import lock_file
from sao_harness.envs.engine import ensure_engine
from sao_harness.eval.grading import (
    dataset_reports,
    gold_preflight,
    grade_predictions,
    resolved_line,
    swebench_report,
)
from sao_harness.eval.paths import EvalPaths, JsonlLog, latest_by_instance, write_json
from sao_harness.eval.policy import Policy, eval_name, resolve_policy
from sao_harness.eval.predict import predict
from sao_harness.eval.report import write_report
from sao_harness.tasks.formats.loaders import (
    _offline_flag,
    hub_unreachable_reason,
    is_local,
    load_tasks_lenient,
    resolve_task_repo,
)
from sao_harness.tasks.images.prepare import prepare_task_images
from sao_harness.tasks.preflight import preflight

FINGERPRINT = ("model_path", "dataset", "split", "sampling", "max_iterations", "context_budget", "guard")


@dataclass
class EvalOutcome:
    dir: Path
    name: str
    report: dict
    files: dict[str, str] = field(default_factory=dict)

    @property
    def resolved_line(self) -> str:
        return resolved_line(self.report["resolved_guarded"], self.report["resolved_official"], self.report["total"])


# --- the tasks and the eval's rollout config -----------------------------------------------
def is_hub_id(dataset: str) -> bool:
    return resolve_task_repo(dataset) is None and not is_local(dataset) and dataset.count("/") == 1


def select_tasks(cfg, instances: list[str] | None, log=print):
    """The eval's tasks, in dataset order, loaded and pre-flighted once per run (everything below is handed
    this list); fails fast (before any episode) on what cannot work."""
    ds = cfg.eval.dataset
    if is_hub_id(ds) and not _offline_flag():
        reason = hub_unreachable_reason(ds)
        if reason is not None:
            raise UserError(
                f"eval.dataset {ds}: the Hugging Face hub is unreachable ({reason}). Evaluating on {ds} needs the "
                "hub (the rows) and Docker Hub (the official swebench/sweb.eval.* images). Without internet, evaluate "
                "on local tasks: eval.dataset=bundled, a swebench task repo, or a local swebench 5.x .jsonl/.parquet "
                "whose images are built locally")
    tasks, errors = load_tasks_lenient(ds, split=cfg.eval.split, adapter="auto", instances=instances or None)
    if not tasks and not errors:
        raise UserError(f"eval.dataset {ds} (split {cfg.eval.split}): no tasks")
    return preflight(cfg, tasks, errors, source=ds, pull=True, log=log)  # gradable, image there or pullable


def eval_run_config(cfg, *, name: str, model_path: str):
    """The config of the eval's rollout: run dir ``<run.dir>/eval/<name>``, the eval dataset as its task source,
    the policy, and ``eval.temperature``/``eval.top_p`` in place of ``sampling.*``. Its tasks are not in it:
    ``select_tasks`` loaded them once and the list goes down (``predict``, ``run_rollout(run_cfg, tasks)``)."""
    data = cfg.model_dump(mode="json")
    data["run"]["root"] = str(Path(cfg.run.dir) / "eval")
    data["run"]["name"] = name
    data["model"]["path"] = model_path
    for key in ("temperature", "top_p"):
        data["sampling"][key] = getattr(cfg.eval, key)
    for key in ("temperature", "top_p", "top_k"):  # unused here; the config copies them from sampling.*
        data["trainer"].pop(key, None)
    data["tasks"] = {"source": cfg.eval.dataset, "split": cfg.eval.split, "adapter": "auto"}
    data["rollout"]["workers"] = cfg.eval.workers or cfg.rollout.workers
    data["rollout"]["episodes_per_task"] = 1
    return type(cfg).model_validate(data)


# --- the eval directory: its settings and its lock -----------------------------------------
def _fingerprint(cfg, run_cfg, policy: Policy) -> dict:
    s = run_cfg.sampling
    return {"model_path": policy.model_path, "dataset": cfg.eval.dataset, "split": cfg.eval.split,
            "sampling": {"temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k, "max_tokens": s.max_tokens},
            "max_iterations": run_cfg.agent.max_iterations, "context_budget": run_cfg.proxy.context_budget,
            "guard": cfg.grading.guard}


def _check_manifest(paths: EvalPaths, manifest: dict) -> None:
    if not paths.manifest.is_file():
        return
    try:
        old = json.loads(paths.manifest.read_text())
    except json.JSONDecodeError:
        return
    diff = [k for k in FINGERPRINT if k in old and old[k] != manifest[k]]
    if diff:
        k = diff[0]
        raise UserError(f"{paths.dir} was evaluated with other settings ({k}: {old[k]} now {manifest[k]}); "
                        "resuming would mix them: set eval.name=NEW or remove that directory")


def _lock_dir(d: Path):
    """An exclusive lock on ``d/.lock`` for this process (released when the file object is closed)."""
    return lock_file(d / ".lock", f"another `sao eval` is running on {d}; wait for it or set eval.name=OTHER")


# --- the run -------------------------------------------------------------------------------
def run_eval(cfg, *, instances: list[str] | None = None, gold: bool | None = None, engine=None, proxy=None,
             log=print) -> EvalOutcome:
    """See the module doc. ``engine``/``proxy``: a policy already served (tests: a scripted one)."""
    t0 = time.monotonic()
    # 1. the policy, the tasks, the eval directory (refused if evaluated with other settings)
    policy = resolve_policy(cfg)
    tasks = select_tasks(cfg, list(instances or cfg.eval.instances or []), log=log)
    name = eval_name(cfg, policy)
    run_cfg = eval_run_config(cfg, name=name, model_path=policy.model_path)
    paths = EvalPaths(Path(run_cfg.run.dir))
    manifest = {"name": name, **_fingerprint(cfg, run_cfg, policy), "model_name_or_path": policy.model_name,
                "checkpoint": policy.checkpoint}
    _check_manifest(paths, manifest)
    paths.dir.mkdir(parents=True, exist_ok=True)
    lock = _lock_dir(paths.dir)  # noqa: F841  (held until this function returns)
    if not paths.manifest.is_file():
        write_json(paths.manifest, {**manifest, "created": time.strftime("%Y-%m-%dT%H:%M:%S")})
    log(f"eval {name}: {len(tasks)} task(s) of {cfg.eval.dataset}, policy {policy.model_name} -> {paths.dir}")
    # 2. the task images, and the gold patches when asked
    client = ensure_engine(cfg.docker)
    prepare_task_images(cfg, client, cfg.eval.dataset, tasks, pull=True, log=log)
    if cfg.eval.gold_preflight if gold is None else gold:
        gold_preflight(cfg, tasks, paths, client, log)
    # 3. predictions, then verdicts, then the report
    preds = predict(run_cfg, tasks, paths, policy, engine=engine, proxy=proxy, log=log)
    run_id = name
    grades = grade_predictions(cfg, tasks, preds, paths, run_id, client, log)
    chosen = {t.instance_id: preds[t.instance_id] for t in tasks if t.instance_id in preds}
    summary = swebench_report(chosen, tasks, run_id, log_root=paths.logs, out_dir=paths.dir, quiet=True)
    per_dataset = dataset_reports(chosen, tasks, run_id, log_root=paths.logs, out_dir=paths.dir,
                                  default=cfg.eval.dataset)
    episodes = latest_by_instance(JsonlLog(paths.episodes).read())
    report, files = write_report(paths.dir, tasks=tasks, preds=preds, grades=grades, episodes=episodes,
                                 manifest=manifest, swebench_summary=summary, seconds=time.monotonic() - t0,
                                 dataset_reports=per_dataset)
    return EvalOutcome(paths.dir, name, report, files)
