"""Node-wide slots: at most ``n`` holders of a named slot at once across every process of a node.

``node_slot(name, n)`` holds one of ``n`` lock files ``<dir>/<name>.<i>.lock`` (an exclusive ``flock``),
waiting until one is free. The OS releases a slot when its holder dies (kill -9 included), so a
crashed process never leaks one. Used to bound the work that would otherwise all start at once on one
node (e.g. gradings: 128 episodes that finish together must not start 384 grading containers).
"""
from __future__ import annotations

import fcntl
import os
import random
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def slots_or_per_core(n: int, per_core: int) -> int:
    """A configured slot count: ``n``, or ``per_core`` per CPU core of this node when ``n`` is 0."""
    return n or per_core * (os.cpu_count() or 1)


def slot_dir() -> Path:
    """Where the lock files live: one directory per node (``$SAO_SLOT_DIR`` or the temp dir's ``sao-slots``)."""
    return Path(os.environ.get("SAO_SLOT_DIR") or Path(tempfile.gettempdir()) / "sao-slots")


@contextmanager
def node_slot(name: str, n: int, poll_s: float = 0.2) -> Iterator[float]:
    """Hold one of ``n`` slots named ``name`` for the ``with`` block; yields the seconds waited for it.
    ``n <= 0`` means no bound (yields 0.0 at once)."""
    if n <= 0:
        yield 0.0
        return
    folder = slot_dir()
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    while True:
        for i in random.sample(range(n), n):  # a random order: no slot is everyone's first try
            f = open(folder / f"{name}.{i}.lock", "a")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                continue
            try:
                yield time.monotonic() - t0
            finally:
                f.close()  # closing the file releases the lock
            return
        time.sleep(poll_s * random.uniform(0.5, 1.5))
