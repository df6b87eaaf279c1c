"""Atomic files: a reader sees the old content or the new, never a half-written file.

Write to a hidden temporary name in the same directory, fsync, ``os.replace`` over the target,
fsync the directory. A crash (kill -9 included) leaves at worst a stray ``.name.*.tmp``.
"""
from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> Path:
    """Call ``write(f)`` on a binary temp file, then publish it as ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def atomic_write_text(path: Path, text: str) -> Path:
    return atomic_write(path, lambda f: f.write(text.encode()))


def atomic_dir(target: Path, write: Callable[[Path], None]) -> Path:
    """``write(tmp_dir)``, then swap it in as ``target``; a crash leaves the previous one whole
    (at worst in ``.<name>.old``)."""
    target = Path(target)
    tmp = target.with_name(f".{target.name}.tmp")
    old = target.with_name(f".{target.name}.old")
    for p in (tmp, old):
        shutil.rmtree(p, ignore_errors=True)
    write(tmp)
    if target.exists():
        target.rename(old)
    tmp.rename(target)
    shutil.rmtree(old, ignore_errors=True)
    return target
