"""Leftovers: remove the containers and volumes of runs that no longer exist, by label.

- A run "no longer exists" when the process named in its labels (pid + its start time, on this
  host) is gone. Runs of another host, or without a pid label, are never judged dead.
- Only objects labeled ``sao-harness.owner=sao-harness`` are ever listed or removed.
- ``cleanup_run(run_id)`` removes one run's objects unconditionally: a run calls it for itself on
  exit. ``run_scope()`` does that on normal exit, on an exception, on Ctrl-C and on SIGTERM/SIGHUP.
"""
from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field

from sao_harness.envs.engine import docker_client
from sao_harness.envs.labels import RUN_KEY, current_run_id, owner_alive, owner_filter


@dataclass
class RunInfo:
    run_id: str
    alive: bool | None  # None = cannot tell (another host / no pid label)
    containers: list = field(default_factory=list)
    volumes: list = field(default_factory=list)


def _merge(a: bool | None, b: bool | None) -> bool | None:
    """A run with several owner processes is alive if any is, dead only if all are known dead."""
    if a is True or b is True:
        return True
    if a is None or b is None:
        return None
    return False


def list_runs(client, run_id: str | None = None) -> dict[str, RunInfo]:
    """Our containers and volumes grouped by run id (optionally one run)."""
    runs: dict[str, RunInfo] = {}

    def add(labels: dict, obj, kind: str) -> None:
        rid = labels.get(RUN_KEY, "?")
        alive = owner_alive(labels)
        info = runs.get(rid)
        if info is None:
            info = runs[rid] = RunInfo(rid, alive)
        else:
            info.alive = _merge(info.alive, alive)
        getattr(info, kind).append(obj)

    for c in client.containers.list(all=True, filters=owner_filter(run_id)):
        add(c.labels, c, "containers")
    for v in client.volumes.list(filters=owner_filter(run_id)):
        add(v.attrs.get("Labels") or {}, v, "volumes")
    return runs


def _remove(info: RunInfo) -> tuple[int, int]:
    nc = nv = 0
    for c in info.containers:
        try:
            c.remove(force=True, v=True)
            nc += 1
        except Exception as e:
            if "No such" not in str(e) and "404" not in str(e):
                print(f"gc: could not remove container {c.name}: {str(e).splitlines()[0][:200]}", file=sys.stderr)
    for v in info.volumes:
        try:
            v.remove(force=True)
            nv += 1
        except Exception as e:
            if "No such" not in str(e) and "404" not in str(e):
                print(f"gc: could not remove volume {v.name}: {str(e).splitlines()[0][:200]}", file=sys.stderr)
    return nc, nv


def cleanup_run(run_id: str | None = None, client=None) -> tuple[int, int]:
    """Remove every container and volume of ``run_id`` (default: this process's run).

    Returns (containers, volumes) removed. Never raises: a missing engine means nothing to clean.
    """
    run_id = run_id or current_run_id()
    try:
        if client is None:
            client = docker_client()
        runs = list_runs(client, run_id)
    except Exception as e:
        print(f"cleanup of run {run_id} skipped: {str(e).splitlines()[0][:200]}", file=sys.stderr)
        return 0, 0
    info = runs.get(run_id)
    return _remove(info) if info else (0, 0)


def gc(client, run_id: str | None = None, dry_run: bool = False) -> list[tuple[RunInfo, str]]:
    """Remove objects of dead runs (all dead runs, or only ``run_id``); returns (run, action) rows."""
    rows = []
    for _rid, info in sorted(list_runs(client, run_id).items()):
        what = f"{len(info.containers)} container(s), {len(info.volumes)} volume(s)"
        if info.alive is not False:
            reason = "alive" if info.alive else "owner unknown (other host or no pid label)"
            rows.append((info, f"kept: {reason}; {what}"))
            continue
        if dry_run:
            rows.append((info, f"would remove {what}"))
            continue
        nc, nv = _remove(info)
        rows.append((info, f"removed {nc} container(s), {nv} volume(s)"))
    return rows


_lock = threading.Lock()
_registered: set[str] = set()


@contextmanager
def run_scope(run_id: str | None = None, client=None):
    """Own ``run_id`` for the block; its containers and volumes are removed however the block ends.

    Covers normal exit, exceptions, Ctrl-C (KeyboardInterrupt) and SIGTERM/SIGHUP (turned into
    SystemExit while the block runs, in the main thread); an ``atexit`` hook backs it up.
    """
    run_id = run_id or current_run_id()
    os.environ.setdefault("SAO_RUN_ID", run_id)
    done = threading.Event()

    def _cleanup():
        if not done.is_set():
            done.set()
            cleanup_run(run_id, client)

    with _lock:
        _registered.add(run_id)
    atexit.register(_cleanup)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        def _on_signal(signum, _frame):
            raise SystemExit(128 + signum)

        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                previous[sig] = signal.signal(sig, _on_signal)
            except (ValueError, OSError):
                pass
    try:
        yield run_id
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _cleanup()
        atexit.unregister(_cleanup)
        with _lock:
            _registered.discard(run_id)
