"""`sao eval --config F`: the agent of a checkpoint on an evaluation set, graded by swebench.

``run_eval(cfg, *, instances=None, gold=None, engine=None, proxy=None, log=print) -> EvalOutcome``:
1. picks the policy (``eval.checkpoint``: a trainer checkpoint's ``policy/``, a model dir, a Hugging
   Face id, ``latest``; None = ``model.path``) and the tasks (``eval.dataset``, ``eval.instances``);
   checks, before any episode, that the dataset is reachable (a hub id fails fast offline), the
   tasks are gradable and their images exist (a task repo's are built; official images pulled where
   a registry answers, else a clear error); optionally grades the gold patches first (``--gold``);
2. runs the episodes (``harness.rollout.run_rollout``, sampling ``eval.temperature``/``eval.top_p``)
   into ``<run.dir>/eval/<name>/traces`` and appends one SWE-bench prediction per instance to
   ``predictions.jsonl`` as soon as its episode ends (an infra error gets none: it is retried);
3. grades each prediction with ``tasks.grade.grade`` (official + guarded verdicts), one line per
   instance in ``grades.jsonl``; writes swebench's summary JSON and the report (``eval.report``).
Resumable: an instance with a prediction is not run again, one with a verdict not graded again.
Every ``.jsonl`` line is written with one ``write`` on an ``O_APPEND`` descriptor and fsynced; a torn
last line (a crash mid-write) is dropped on the next start.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from core.errors import UserError

PRED_KEYS = ("instance_id", "model_name_or_path", "model_patch")
FINGERPRINT = ("model_path", "dataset", "split", "sampling", "max_iterations", "context_budget", "guard")


# --- files ---------------------------------------------------------------------------------
class JsonlLog:
    """An append-only JSON-lines file: whole lines or nothing (see module doc)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()

    def read(self) -> list[dict]:
        """Every complete record; a torn last line is cut off the file."""
        if not self.path.is_file():
            return []
        data = self.path.read_bytes()
        out, good = [], 0
        for line in data.splitlines(keepends=True):
            if not line.endswith(b"\n"):
                break
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                break
            if isinstance(rec, dict):
                out.append(rec)
            good += len(line)
        if good < len(data):  # a torn line (crash mid-write): drop it so the next append starts clean
            with open(self.path, "r+b") as f:
                f.truncate(good)
        return out

    def append(self, record: dict) -> None:
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)


@dataclass
class EvalPaths:
    dir: Path

    @property
    def predictions(self) -> Path:
        return self.dir / "predictions.jsonl"

    @property
    def grades(self) -> Path:
        return self.dir / "grades.jsonl"

    @property
    def episodes(self) -> Path:
        return self.dir / "episodes.jsonl"

    @property
    def manifest(self) -> Path:
        return self.dir / "eval.json"

    @property
    def logs(self) -> Path:
        return self.dir / "logs" / "run_evaluation"

    @property
    def traces(self) -> Path:
        return self.dir / "traces"


def write_json(path: Path, data) -> None:
    """Write ``data`` as JSON atomically (temporary name, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    tmp.replace(path)


def latest_by_instance(records: list[dict]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for r in records:
        if isinstance(r.get("instance_id"), str):
            out[r["instance_id"]] = r
    return out


# --- the policy ----------------------------------------------------------------------------
@dataclass
class Policy:
    model_path: str  # what the engine loads (model.path of the eval run)
    model_name: str  # model_name_or_path in predictions
    tag: str  # short name for the eval directory
    checkpoint: str | None  # the checkpoint as configured


def _slug(text: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_.-]+", "_", text.replace("/", "__")).strip("._-")
    return s or "model"


def _is_model_dir(p: Path) -> bool:
    return (p / "config.json").is_file()


def _step_key(p: Path) -> tuple:
    nums = re.findall(r"\d+", p.name)
    return (int(nums[-1]) if nums else -1, p.stat().st_mtime)


def latest_checkpoint(run_dir: Path) -> Path:
    """The newest complete checkpoint of a run: the one ``checkpoints/latest`` names, else the highest step."""
    root = Path(run_dir) / "checkpoints"
    named = (root / "latest").read_text().strip() if (root / "latest").is_file() else ""
    if named and _is_model_dir(root / named / "policy"):
        return root / named
    found = [d for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")
             and _is_model_dir(d / "policy")] if root.is_dir() else []
    if not found:
        raise UserError(f"eval.checkpoint=latest: no checkpoint (a directory with policy/config.json) under {root}; "
                        "train first (sao train) or name one")
    return max(found, key=_step_key)


def resolve_policy(cfg) -> Policy:
    """The model the eval runs (see ``EvalConfig.checkpoint``); a clear error for a bad one."""
    ck = cfg.eval.checkpoint
    if ck is None:
        from harness.tiny_model import resolve_model_path

        path = resolve_model_path(cfg.model)
        name = cfg.model.path if cfg.model.path == "tiny" or not Path(cfg.model.path).exists() else path
        tag = "tiny" if cfg.model.path == "tiny" else _slug(Path(cfg.model.path).name if Path(cfg.model.path).exists()
                                                            else cfg.model.path)
        return Policy(path, name, tag, None)
    p = Path(ck) if ck != "latest" else latest_checkpoint(cfg.run.dir)
    if p.exists():
        if _is_model_dir(p / "policy"):
            model = p / "policy"
            tag = p.name
        elif _is_model_dir(p):
            model = p
            tag = p.parent.name if p.name == "policy" else p.name
        else:
            raise UserError(f"eval.checkpoint {ck}: neither a trainer checkpoint (policy/config.json) nor a model "
                            "directory (config.json)")
        if not any((model / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
            raise UserError(f"eval.checkpoint {ck}: {model} has no tokenizer (tokenizer.json / tokenizer_config.json); "
                            "save the tokenizer with the policy")
        return Policy(str(model), f"{_slug(cfg.run.name)}-{_slug(tag)}", _slug(tag), str(ck))
    if re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", ck) and not ck.startswith((".", "/", "~")):
        return Policy(ck, ck, _slug(ck.split("/")[-1]), ck)  # a Hugging Face model id
    raise UserError(f"eval.checkpoint {ck}: not found (a checkpoint dir, a model dir, a Hugging Face id or 'latest')")


def dataset_tag(dataset: str) -> str:
    if dataset == "bundled" or "/" not in dataset and not Path(dataset).exists():
        return _slug(dataset)
    p = Path(dataset)
    if p.exists():
        return _slug(p.stem if p.is_file() else p.name)
    return _slug(dataset.split("/")[-1])


def eval_name(cfg, policy: Policy) -> str:
    return cfg.eval.name or f"{policy.tag}.{dataset_tag(cfg.eval.dataset)}"


def eval_run_config(cfg, *, name: str, model_path: str, instances: list[str]):
    """The config of the eval's rollout: run dir ``<run.dir>/eval/<name>``, the eval dataset and
    instances, the policy, and ``eval.temperature``/``eval.top_p`` in place of ``sampling.*``."""
    data = cfg.model_dump(mode="json")
    data["run"]["root"] = str(Path(cfg.run.dir) / "eval")
    data["run"]["name"] = name
    data["model"]["path"] = model_path
    for key in ("temperature", "top_p"):
        data["sampling"][key] = getattr(cfg.eval, key)
    for key in ("temperature", "top_p", "top_k"):  # unused here; the config copies them from sampling.*
        data["trainer"].pop(key, None)
    data["tasks"] = {"source": cfg.eval.dataset, "split": cfg.eval.split, "adapter": "auto", "instances": instances}
    data["rollout"]["workers"] = cfg.eval.workers or cfg.rollout.workers
    data["rollout"]["episodes_per_task"] = 1
    return type(cfg).model_validate(data)


# --- tasks and images ----------------------------------------------------------------------
def is_hub_id(dataset: str) -> bool:
    from tasks.loaders import is_local, resolve_task_repo

    return resolve_task_repo(dataset) is None and not is_local(dataset) and dataset.count("/") == 1


def select_tasks(cfg, instances: list[str] | None):
    """The eval's tasks, in dataset order; fails fast (before any episode) on what cannot work."""
    from tasks.loaders import _offline_flag, hub_unreachable_reason, load_tasks_lenient

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
    if errors:
        raise UserError(f"eval.dataset {ds}: {len(errors)} row(s) do not validate, e.g. {errors[0]}")
    if not tasks:
        raise UserError(f"eval.dataset {ds} (split {cfg.eval.split}): no tasks")
    bad = [t for t in tasks if not t.gradable]
    if bad:
        t = bad[0]
        raise UserError(f"eval.dataset {ds}: {len(bad)} task(s) not gradable here, e.g. {t.instance_id}: "
                        + "; ".join(t.grading_gaps() + t.notes))
    return tasks


def registry_unreachable_reason(timeout: float = 4.0) -> str | None:
    import httpx

    try:
        r = httpx.get("https://registry-1.docker.io/v2/", timeout=timeout)
    except Exception as e:
        return f"{type(e).__name__} contacting registry-1.docker.io"
    return None if r.status_code in (200, 401) else f"HTTP {r.status_code} from registry-1.docker.io"


def ensure_images(cfg, client, tasks, log=print) -> None:
    """Build a task repo's missing images; pull other missing ones where Docker Hub answers; else fail."""
    from tasks.grade import image_exists
    from tasks.loaders import resolve_task_repo

    repo = resolve_task_repo(cfg.eval.dataset)
    if repo is not None:
        from tasks.build import build_task_repo, resolve_base_image

        missing = [t.instance_id for t in tasks if not image_exists(client, t.image)]
        if missing:
            log(f"building {len(missing)} missing task image(s) of {repo}")
        base = resolve_base_image(cfg, client, log=log)
        results = build_task_repo(client, repo, base, only=[t.instance_id for t in tasks],
                                  log=log if missing else (lambda *_: None))
        failed = [r for r in results if r.status == "failed"]
        if failed:
            raise UserError(f"{len(failed)} task image(s) failed to build, e.g. {failed[0].instance_id}: "
                            f"{failed[0].error.splitlines()[0] if failed[0].error else '?'}")
        return
    missing = sorted({t.image for t in tasks if not image_exists(client, t.image)})
    if not missing:
        return
    reason = registry_unreachable_reason()
    if reason is not None:
        raise UserError(f"{len(missing)} task image(s) missing locally, e.g. {missing[0]}, and Docker Hub is "
                        f"unreachable ({reason}); build them (sao tasks build --task-repo DIR) or run where "
                        "a registry is reachable")
    for i, image in enumerate(missing, 1):
        log(f"[{i}/{len(missing)}] pulling {image}")
        try:
            client.images.pull(image)
        except Exception as e:
            raise UserError(f"pulling {image} failed: {type(e).__name__}: {e}") from None


def gold_preflight(cfg, tasks, paths: EvalPaths, client, log=print) -> None:
    """Grade every task's gold patch; raise UserError naming those that do not resolve."""
    from concurrent.futures import ThreadPoolExecutor

    from tasks.grade import RESOLVED, grade, new_run_id

    run_id = new_run_id("gold")
    root = paths.dir / "preflight" / "logs"
    log(f"gold preflight: grading the gold patches of {len(tasks)} task(s) (run id {run_id})")
    t0 = time.monotonic()

    def one(task):
        return grade(task, task.patch, run_id=run_id, timeout=cfg.eval.grade_timeout_s, client=client,
                     guard=cfg.eval.guard, model="gold", log_root=root)

    with ThreadPoolExecutor(cfg.eval.max_workers) as pool:
        results = list(pool.map(one, tasks))
    bad = [r for r in results if r.status != RESOLVED]
    write_json(paths.dir / "preflight" / "gold.json", {"run_id": run_id, "results": [r.to_dict() for r in results]})
    if bad:
        detail = ", ".join(f"{r.instance_id} ({r.status}{': ' + r.error if r.error else ''})" for r in bad[:5])
        raise UserError(f"gold preflight: {len(bad)}/{len(results)} gold patch(es) do not resolve: {detail}"
                        f"{' ...' if len(bad) > 5 else ''}. The grading environment is broken for them; fix it "
                        f"before spending model time (logs: {root})")
    log(f"gold preflight: {len(results)}/{len(results)} gold patches resolve ({time.monotonic() - t0:.1f} s)")


# --- the run -------------------------------------------------------------------------------
def _lock_dir(d: Path):
    """An exclusive lock on ``d/.lock`` for this process (released when the file object is closed)."""
    from core.runlock import lock_file

    return lock_file(d / ".lock", f"another `sao eval` is running on {d}; wait for it or set eval.name=OTHER")


@dataclass
class EvalOutcome:
    dir: Path
    name: str
    report: dict
    files: dict[str, str] = field(default_factory=dict)

    @property
    def resolved_line(self) -> str:
        r, m = self.report["resolved_guarded"], self.report["total"]
        return f"resolved: {r}/{m} guarded, {self.report['resolved_official']}/{m} official"


def _fingerprint(cfg, run_cfg, policy: Policy) -> dict:
    s = run_cfg.sampling
    return {"model_path": policy.model_path, "dataset": cfg.eval.dataset, "split": cfg.eval.split,
            "sampling": {"temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k, "max_tokens": s.max_tokens},
            "max_iterations": run_cfg.agent.max_iterations, "context_budget": run_cfg.proxy.context_budget,
            "guard": cfg.eval.guard}


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


def episode_record(traj, shard=None) -> dict:
    t = traj.timings or {}
    err = traj.metadata.get("infra_error") or (traj.metadata.get("agent") or {}).get("error")
    return {"instance_id": traj.task_id, "traj_id": traj.traj_id, "shard": str(shard) if shard else None,
            "status": traj.status, "turns": traj.turns, "tokens": traj.num_tokens,
            "action_tokens": traj.num_action_tokens, "seconds": round(float(t.get("episode_s", 0.0)), 2),
            "patch_lines": len(traj.patch.splitlines()), "error": err,
            "attempt": traj.metadata.get("attempt", 0)}


def reconcile(paths: EvalPaths, model_name: str, wanted: set[str], preds: dict, episodes: JsonlLog,
              predictions: JsonlLog, log=print) -> int:
    """Trajectories stored without their prediction (a crash between the two): write the prediction."""
    import pyarrow.parquet as pq

    from harness.store import TraceStore, read_shard

    store = TraceStore(paths.dir)
    store.clean_partial()
    n = 0
    for shard in store.shards():
        t = pq.read_table(shard, columns=["task_id", "status"])
        ids = t.column("task_id").to_pylist()
        statuses = t.column("status").to_pylist()
        if not any(i in wanted and i not in preds and s != "infra_error" for i, s in zip(ids, statuses)):
            continue
        for traj in read_shard(shard):
            if traj.task_id in wanted and traj.task_id not in preds and traj.status != "infra_error":
                episodes.append(episode_record(traj, shard))
                rec = {"instance_id": traj.task_id, "model_name_or_path": model_name, "model_patch": traj.patch or ""}
                predictions.append(rec)
                preds[traj.task_id] = rec
                n += 1
    if n:
        log(f"resume: {n} stored trajectory(ies) had no prediction line yet; written")
    return n


def predict(run_cfg, tasks, paths: EvalPaths, policy: Policy, *, engine=None, proxy=None, log=print) -> dict:
    """Episodes for the tasks without a prediction; returns {instance_id: prediction}."""
    from harness.rollout import run_rollout

    predictions, episodes = JsonlLog(paths.predictions), JsonlLog(paths.episodes)
    wanted = {t.instance_id for t in tasks}
    preds = {iid: p for iid, p in latest_by_instance(predictions.read()).items() if iid in wanted}
    reconcile(paths, policy.model_name, wanted, preds, episodes, predictions, log)
    todo = [t.instance_id for t in tasks if t.instance_id not in preds]
    if len(preds):
        log(f"resume: {len(preds)}/{len(tasks)} instance(s) already predicted in {paths.predictions}")
    if not todo:
        return preds
    run_cfg = run_cfg.model_copy(deep=True)
    run_cfg.tasks.instances = todo

    def on_trajectory(traj, shard):
        episodes.append(episode_record(traj, shard))
        if traj.status == "infra_error":  # no verdict, never a 0: no prediction, retried on the next run
            return
        rec = {"instance_id": traj.task_id, "model_name_or_path": policy.model_name, "model_patch": traj.patch or ""}
        predictions.append(rec)
        preds[traj.task_id] = rec

    log(f"predicting {len(todo)} instance(s) with {policy.model_name} (temperature {run_cfg.sampling.temperature:g}, "
        f"top_p {run_cfg.sampling.top_p:g}, {run_cfg.rollout.workers} at a time)")
    run_rollout(run_cfg, engine=engine, proxy=proxy, grade=False, on_trajectory=on_trajectory, log=log)
    return preds


def _clear_logs(paths: EvalPaths, run_id: str, model: str, iid: str) -> None:
    for rid in (run_id, f"{run_id}.guarded"):
        d = paths.logs / rid / model.replace("/", "__") / iid
        if d.exists():
            shutil.rmtree(d)


def grade_predictions(cfg, tasks, preds: dict, paths: EvalPaths, run_id: str, client, log=print) -> dict:
    """Grade every prediction without a verdict yet; returns {instance_id: grade record}."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    from tasks.grade import INFRA, grade

    log_ = JsonlLog(paths.grades)
    grades = {iid: g for iid, g in latest_by_instance(log_.read()).items() if iid in preds}
    done = {iid for iid, g in grades.items() if g.get("status") != INFRA and g.get("official_status") != INFRA}
    todo = [t for t in tasks if t.instance_id in preds and t.instance_id not in done]
    if done:
        log(f"resume: {len(done)} instance(s) already graded in {paths.grades}")
    if not todo:
        return grades
    log(f"grading {len(todo)} prediction(s) with swebench (run id {run_id}, {cfg.eval.max_workers} at a time, "
        f"guard {'on' if cfg.eval.guard else 'off'})")

    def one(task):
        p = preds[task.instance_id]
        _clear_logs(paths, run_id, p["model_name_or_path"], task.instance_id)
        return grade(task, p["model_patch"], run_id=run_id, timeout=cfg.eval.grade_timeout_s, client=client,
                     guard=cfg.eval.guard, model=p["model_name_or_path"], log_root=paths.logs)

    n = len(todo)
    with ThreadPoolExecutor(cfg.eval.max_workers) as pool:
        futures = {pool.submit(one, t): t for t in todo}
        for i, fut in enumerate(as_completed(futures), 1):
            r = fut.result()
            rec = {**r.to_dict(), "run_id": run_id}
            log_.append(rec)
            grades[r.instance_id] = rec
            extra = f", stripped {', '.join(r.stripped_files)}" if r.stripped_files else ""
            err = f" ({r.error})" if r.error else ""
            log(f"[{i}/{n}] {r.instance_id}: {r.status} (official {r.official_status}), hacking attempts "
                f"{r.hacking_attempts}{extra}, {r.seconds:.1f} s{err}")
    return grades


def swebench_summary(tasks, preds: dict, paths: EvalPaths, run_id: str) -> str | None:
    """swebench's own summary JSON (``<model>.<run_id>.json`` in the eval dir), written by swebench."""
    import contextlib
    import io

    from swebench.harness.reporting import make_run_report

    from tasks.grade import LOG_ROOT

    chosen = {t.instance_id: preds[t.instance_id] for t in tasks if t.instance_id in preds}
    if not chosen:
        return None
    with LOG_ROOT.use(paths.logs), contextlib.redirect_stdout(io.StringIO()):
        return str(make_run_report(chosen, [t.to_row() for t in tasks], run_id, None, str(paths.dir)))


def run_eval(cfg, *, instances: list[str] | None = None, gold: bool | None = None, engine=None, proxy=None,
             log=print) -> EvalOutcome:
    """See the module doc. ``engine``/``proxy``: a policy already served (tests: a scripted one)."""
    from envs.engine import ensure_engine
    from eval.report import write_report

    t0 = time.monotonic()
    policy = resolve_policy(cfg)
    instances = list(instances or cfg.eval.instances or [])
    tasks = select_tasks(cfg, instances)
    name = eval_name(cfg, policy)
    run_cfg = eval_run_config(cfg, name=name, model_path=policy.model_path, instances=[t.instance_id for t in tasks])
    paths = EvalPaths(Path(run_cfg.run.dir))
    manifest = {"name": name, **_fingerprint(cfg, run_cfg, policy), "model_name_or_path": policy.model_name,
                "checkpoint": policy.checkpoint}
    _check_manifest(paths, manifest)
    paths.dir.mkdir(parents=True, exist_ok=True)
    lock = _lock_dir(paths.dir)  # noqa: F841  (held until this function returns)
    if not paths.manifest.is_file():
        write_json(paths.manifest, {**manifest, "created": time.strftime("%Y-%m-%dT%H:%M:%S")})
    log(f"eval {name}: {len(tasks)} task(s) of {cfg.eval.dataset}, policy {policy.model_name} -> {paths.dir}")
    client = ensure_engine(cfg.docker)
    ensure_images(cfg, client, tasks, log)
    if cfg.eval.gold_preflight if gold is None else gold:
        gold_preflight(cfg, tasks, paths, client, log)
    preds = predict(run_cfg, tasks, paths, policy, engine=engine, proxy=proxy, log=log)
    run_id = name
    grades = grade_predictions(cfg, tasks, preds, paths, run_id, client, log)
    summary = swebench_summary(tasks, preds, paths, run_id)
    episodes = latest_by_instance(JsonlLog(paths.episodes).read())
    report, files = write_report(paths.dir, tasks=tasks, preds=preds, grades=grades, episodes=episodes,
                                 manifest=manifest, swebench_summary=summary, seconds=time.monotonic() - t0)
    return EvalOutcome(paths.dir, name, report, files)
