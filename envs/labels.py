"""Labels on every container and volume the project creates, and who owns a run.

A run is identified by ``sao-harness.run-id``; the labels also carry the owning process (pid, its
start time, host), so ``envs.gc`` can tell a live run from a dead one. Nothing without
``sao-harness.owner=sao-harness`` is ever touched.
"""
from __future__ import annotations

import os
import socket
import time
import uuid
from pathlib import Path

OWNER_KEY = "sao-harness.owner"
OWNER_VALUE = "sao-harness"
RUN_KEY = "sao-harness.run-id"
CREATED_KEY = "sao-harness.created-at"
PID_KEY = "sao-harness.pid"
PID_START_KEY = "sao-harness.pid-start"
HOST_KEY = "sao-harness.host"

_run_id: str | None = None


def process_start_time(pid: int) -> str | None:
    """Start time of ``pid`` in clock ticks since boot (from /proc), or None if it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def current_run_id() -> str:
    """This process's run id: ``$SAO_RUN_ID`` if set, else one made once per process."""
    global _run_id
    if _run_id is None:
        _run_id = os.environ.get("SAO_RUN_ID") or f"run-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
    return _run_id


def run_labels(run_id: str | None = None, **extra: str) -> dict[str, str]:
    """Labels for a container/volume owned by ``run_id`` (default: this process's run)."""
    pid = os.getpid()
    return {
        OWNER_KEY: OWNER_VALUE,
        RUN_KEY: run_id or current_run_id(),
        CREATED_KEY: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        PID_KEY: str(pid),
        PID_START_KEY: process_start_time(pid) or "",
        HOST_KEY: socket.gethostname(),
        **extra,
    }


def owner_filter(run_id: str | None = None) -> dict:
    """docker-py ``filters`` selecting our objects (of one run if given)."""
    labels = [f"{OWNER_KEY}={OWNER_VALUE}"]
    if run_id:
        labels.append(f"{RUN_KEY}={run_id}")
    return {"label": labels}


def owner_alive(labels: dict[str, str]) -> bool | None:
    """True/False if the owning process is/is not alive; None if unknowable (another host, no pid)."""
    if labels.get(HOST_KEY) != socket.gethostname():
        return None
    try:
        pid = int(labels.get(PID_KEY, ""))
    except ValueError:
        return None
    start = process_start_time(pid)
    if start is None:
        return False
    want = labels.get(PID_START_KEY)
    return start == want if want else True
