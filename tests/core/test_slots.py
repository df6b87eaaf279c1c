"""core.slots.node_slot: at most n holders at once across processes; a dead holder's slot comes back."""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import pytest

from sao_harness.core.slots import node_slot


def _hold(name: str, n: int, seconds: float, log_dir: str) -> None:
    with node_slot(name, n, poll_s=0.02):
        path = os.path.join(log_dir, f"{os.getpid()}")
        with open(path, "w") as f:
            f.write(f"{time.time()}\n")
        time.sleep(seconds)
        with open(path, "a") as f:
            f.write(f"{time.time()}\n")


def _max_overlap(log_dir) -> int:
    spans = []
    for name in os.listdir(log_dir):
        start, end = (float(x) for x in open(os.path.join(log_dir, name)).read().split())
        spans.append((start, end))
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    held = most = 0
    for _, d in events:
        held += d
        most = max(most, held)
    return most


@pytest.mark.parametrize("n", [1, 3])
def test_at_most_n_processes_hold_the_slot_at_once(tmp_path, monkeypatch, n):
    monkeypatch.setenv("SAO_SLOT_DIR", str(tmp_path / "slots"))
    log = tmp_path / "log"
    log.mkdir()
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_hold, args=("grade", n, 0.3, str(log))) for _ in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert all(p.exitcode == 0 for p in procs)
    assert len(os.listdir(log)) == 6
    assert _max_overlap(log) == n  # the bound holds and is reached: 6 holders of 0.3 s overlap n at a time


def test_power_without_the_bound_all_overlap(tmp_path, monkeypatch):
    monkeypatch.setenv("SAO_SLOT_DIR", str(tmp_path / "slots"))
    log = tmp_path / "log"
    log.mkdir()
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_hold, args=("grade", 0, 0.5, str(log))) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert _max_overlap(log) == 4  # n <= 0: no bound, so the overlap count above measures something


def test_a_killed_holders_slot_is_free_again(tmp_path, monkeypatch):
    monkeypatch.setenv("SAO_SLOT_DIR", str(tmp_path / "slots"))
    log = tmp_path / "log"
    log.mkdir()
    holder = mp.get_context("fork").Process(target=_hold, args=("grade", 1, 60, str(log)))
    holder.start()
    deadline = time.monotonic() + 10
    while not os.listdir(log) and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(10)
    t0 = time.monotonic()
    with node_slot("grade", 1, poll_s=0.02) as waited:
        assert waited < 5 and time.monotonic() - t0 < 5
