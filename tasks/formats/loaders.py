"""Task loaders: every source yields validated ``Task`` objects.

``load_tasks(source, split=, adapter=, instances=)`` where ``source`` is
- ``bundled``: the project's task repository ``tasks/bundled/``;
- a swebench task-repo directory (``sweb.yaml`` + ``tasks/<id>/...``), read with swebench's own
  ``swebench.task.repo.load_task_repo``;
- a local ``.jsonl`` / ``.json`` / ``.parquet`` file or a ``datasets`` ``save_to_disk`` directory;
- a Hugging Face dataset id (``SWE-bench/SWE-bench_Verified``), through ``datasets`` where the hub is
  reachable. Reachability is probed first with a short timeout, so an offline machine fails in
  seconds with a message saying how to pass a local file instead;
- several of these, comma-separated: a mixed source (``Task.source`` names the part a task came from;
  ``sao eval`` reports per part).

Each row goes through an adapter (``tasks.formats.adapters``; ``adapter="auto"`` picks it from the columns
and ``Task.adapter`` says which). Errors are ``TaskError``/``UserError`` with one line naming the
source, instance and field.
"""
from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

from sao_harness.core.errors import UserError
from sao_harness.tasks.formats.adapters import UnknownFormat, adapt
from sao_harness.tasks.model import Task, TaskError

BUNDLED = Path(str(resources.files("sao_harness.tasks") / "bundled"))  # package data: in the checkout or the wheel
HUB_PROBE_TIMEOUT_S = 4.0


# --- source kinds ----------------------------------------------------------------------------
def resolve_task_repo(source: str | Path) -> Path | None:
    """The task-repo directory ``source`` names (``bundled`` included), or None if it is not one."""
    if str(source) == "bundled":
        return BUNDLED
    p = Path(source)
    if p.is_dir() and ((p / "sweb.yaml").is_file() or (p / "tasks").is_dir()):
        return p
    return None


def is_local(source: str) -> bool:
    p = Path(source)
    return p.exists() or p.suffix in (".jsonl", ".json", ".parquet") or source.startswith((".", "/", "~"))


# --- raw rows ----------------------------------------------------------------------------------
def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{n}: not valid JSON ({e.msg})") from None
    return rows


def read_local_rows(path: str | Path, split: str = "test") -> list[dict]:
    """Rows of a local .jsonl/.json/.parquet file or save_to_disk directory."""
    p = Path(path).expanduser()
    if not p.exists():
        raise UserError(f"task source not found: {p}")
    if p.is_dir():
        import datasets  # lazy: datasets is heavy; only a save_to_disk directory needs it

        if not ((p / "dataset_info.json").is_file() or (p / "dataset_dict.json").is_file()
                or (p / "state.json").is_file()):
            raise UserError(f"{p}: neither a swebench task repo (sweb.yaml, tasks/) "
                            "nor a datasets save_to_disk directory")
        ds = datasets.load_from_disk(str(p))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise UserError(f"{p}: no split {split!r} (has: {', '.join(ds)})")
            ds = ds[split]
        return [dict(r) for r in ds]
    if p.suffix == ".jsonl":
        return _read_jsonl(p)
    if p.suffix == ".json":
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise UserError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from None
        if isinstance(data, dict):  # {instance_id: row} or {"split": [rows]}
            data = data.get(split) if isinstance(data.get(split), list) else list(data.values())
        if not isinstance(data, list):
            raise UserError(f"{p}: expected a JSON list of task rows")
        return data
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq  # lazy: pyarrow is heavy; only a .parquet file needs it

        return pq.read_table(p).to_pylist()
    raise UserError(f"{p}: unsupported task file type {p.suffix!r} (use .jsonl, .json, .parquet, "
                    "a save_to_disk directory or a swebench task repo)")


def hub_unreachable_reason(dataset_id: str) -> str | None:
    """Why the Hugging Face hub cannot serve ``dataset_id`` right now (None = reachable)."""
    if _offline_flag():
        return "HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set"
    # lazy: httpx and huggingface_hub are heavy; only a Hugging Face dataset id needs them
    import httpx
    from huggingface_hub import constants

    url = f"{constants.ENDPOINT}/api/datasets/{dataset_id}"
    try:
        r = httpx.get(url, timeout=HUB_PROBE_TIMEOUT_S, follow_redirects=True)
    except Exception as e:  # DNS, connect, proxy refusal, TLS, timeout: all mean "not reachable"
        return f"{type(e).__name__} contacting {constants.ENDPOINT}"
    if r.status_code in (200, 401, 403) and r.headers.get("content-type", "").startswith("application/json"):
        return None
    if r.status_code == 404:
        return None  # reachable: datasets will say the id does not exist
    return f"HTTP {r.status_code} from {constants.ENDPOINT}"


def _offline_flag() -> bool:
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def read_hub_rows(dataset_id: str, split: str) -> list[dict]:
    """Rows of a Hugging Face dataset; fails in seconds when the hub cannot be reached."""
    import datasets  # lazy: datasets is heavy

    if _offline_flag():  # offline mode: the local datasets cache only (no network retries)
        try:
            return [dict(r) for r in datasets.load_dataset(dataset_id, split=split)]
        except Exception:
            raise UserError(f"dataset {dataset_id!r}: the Hugging Face hub is unreachable (HF_HUB_OFFLINE is set) "
                            f"and the dataset is not in the local cache; pass a local file instead "
                            f"(tasks.source=/path/to/rows.jsonl, .parquet, a save_to_disk directory or a swebench "
                            f"task repo)") from None
    reason = hub_unreachable_reason(dataset_id)
    if reason is not None:
        raise UserError(f"dataset {dataset_id!r}: the Hugging Face hub is unreachable ({reason}); pass a local "
                        f"file instead (tasks.source=/path/to/rows.jsonl, .parquet, a save_to_disk directory or "
                        f"a swebench task repo), or set HF_HUB_OFFLINE=1 to use a copy in the local cache")
    try:
        return [dict(r) for r in datasets.load_dataset(dataset_id, split=split)]
    except Exception as e:
        raise UserError(f"dataset {dataset_id!r} split {split!r}: "
                        f"{type(e).__name__}: {str(e).splitlines()[0]}") from None


# --- tasks -------------------------------------------------------------------------------------
def _task_repo_rows(repo: Path, split: str, instances: list[str] | None) -> list[tuple[str, Any]]:
    """(id, row-or-error) for each task directory; a broken directory becomes a TaskError."""
    from swebench.task.repo import load_task, task_dirs  # lazy: swebench is heavy

    if not repo.is_dir():
        raise UserError(f"task repo not found: {repo}")
    try:
        dirs = task_dirs(repo)
    except FileNotFoundError as e:
        raise UserError(str(e)) from None
    by_id = {d.name: d for d in dirs}
    if instances:
        missing = [i for i in instances if i not in by_id]
        if missing:
            raise UserError(f"{repo}: no task directory for {' '.join(missing)}")
        dirs = [by_id[i] for i in instances]
    out = []
    for d in dirs:
        try:
            row = load_task(d)
        except FileNotFoundError as e:
            out.append((d.name, TaskError(d.name, None, f"task directory incomplete: missing {Path(e.filename).name}")))
            continue
        except Exception as e:
            out.append((d.name, TaskError(d.name, None, f"unreadable task directory: {e}")))
            continue
        if not instances and split and row.get("split") not in (split, None):
            continue
        out.append((d.name, row))
    return out


def source_parts(source: str) -> list[str]:
    """The sources ``source`` names: itself, or for a mixed source the comma-separated parts
    (``bundled,rows/swe_gym.jsonl,nebius/SWE-rebench``)."""
    source = str(source)
    if "," not in source or Path(source).exists():
        return [source]
    return [p.strip() for p in source.split(",") if p.strip()]


def _source_rows(source: str, split: str, instances: list[str] | None) -> list:
    repo = resolve_task_repo(source)
    if repo is not None:
        return [row for _, row in _task_repo_rows(repo, split, instances)]
    if is_local(source):
        return read_local_rows(source, split)
    if source.count("/") == 1:
        return read_hub_rows(source, split)
    raise UserError(f"task source {source!r}: not a file, directory, 'bundled' or a Hugging Face "
                    "dataset id (owner/name)")


def load_tasks_lenient(source: str, *, split: str = "test", adapter: str = "auto",
                       instances: list[str] | None = None) -> tuple[list[Task], list[TaskError]]:
    """Every task of ``source`` (one source, or several: ``source_parts``) that validates, and a
    TaskError for each one that does not; ``Task.source`` names the part it came from."""
    parts = source_parts(source)
    repo = resolve_task_repo(parts[0]) if len(parts) == 1 else None  # a lone task repo reads only `instances`
    rows = [(part, row) for part in parts for row in _source_rows(part, split, instances if repo else None)]
    tasks, errors = [], []
    seen: set[str] = set()
    for part, row in rows:
        if isinstance(row, TaskError):
            errors.append(row)
            continue
        try:
            mapped, notes, used = adapt(row, adapter)  # ids are known after adapting (R2E-Gym makes them)
            task = Task.from_row(mapped, notes)
        except TaskError as e:
            errors.append(e)
            continue
        except UnknownFormat as e:  # the source's format, not one row's fault
            raise UserError(f"{part}: {e}") from None
        if task.instance_id in seen:
            errors.append(TaskError(task.instance_id, "instance_id", "duplicate instance id in the source"))
            continue
        seen.add(task.instance_id)
        task.adapter, task.source = used, part
        tasks.append(task)
    if instances and repo is None:
        missing = [i for i in instances if i not in seen | {e.instance_id for e in errors}]
        if missing:
            raise UserError(f"{source}: no task {' '.join(missing)}")
        wanted = set(instances)
        tasks = [t for t in tasks if t.instance_id in wanted]
        errors = [e for e in errors if e.instance_id in wanted]
    return tasks, errors


def load_tasks(source: str, *, split: str = "test", adapter: str = "auto",
               instances: list[str] | None = None) -> list[Task]:
    """Validated tasks of ``source``; the first malformed row raises its TaskError."""
    tasks, errors = load_tasks_lenient(source, split=split, adapter=adapter, instances=instances)
    if errors:
        raise errors[0]
    return tasks


def load_task_repo(repo: str | Path, instances: list[str] | None = None, split: str = "test") -> list[Task]:
    """Tasks of a swebench task repository (``sweb.yaml`` + ``tasks/<id>/``)."""
    path = resolve_task_repo(repo)
    if path is None:
        raise UserError(f"{repo}: not a swebench task repo (no sweb.yaml or tasks/ directory)")
    return load_tasks(str(path), split=split, adapter="swebench", instances=instances)


def tasks_from_config(cfg) -> tuple[list[Task], list[TaskError]]:
    """Tasks named by the ``tasks`` config section."""
    t = cfg.tasks
    return load_tasks_lenient(t.source, split=t.split, adapter=t.adapter, instances=t.instances or None)
