"""One process per run directory: an exclusive, non-blocking ``flock`` on a lock file.

The lock is held while the returned file object is open and released by the OS when the process
dies (kill -9 included), so a crashed run never leaves a stale lock behind.
"""
from __future__ import annotations

import fcntl
from pathlib import Path

from sao_harness.core.errors import UserError


def lock_file(path: Path, busy: str):
    """Lock ``path`` (created if missing) or raise ``UserError(busy)`` if another process holds it."""
    f = open(path, "w")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise UserError(busy) from None
    return f
