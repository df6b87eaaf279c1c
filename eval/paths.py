"""The files of one evaluation, ``<run.dir>/eval/<name>/``, and how they are written.

Every ``.jsonl`` line is written with one ``write`` on an ``O_APPEND`` descriptor and fsynced; a torn
last line (a crash mid-write) is dropped on the next read. JSON files are replaced atomically.
"""
from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path


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
    """{instance_id: its last record}: a later line (a retry) wins."""
    out: dict[str, dict] = {}
    for r in records:
        if isinstance(r.get("instance_id"), str):
            out[r["instance_id"]] = r
    return out
