"""Trace store: Parquet shards under ``<run_dir>/traces``, each written whole or not at all.

A shard is written to a hidden temporary name in the same directory, fsynced, then renamed
(atomic on POSIX): a crash leaves either no shard or a complete one, never half of one. Shard names
sort by creation time, which is the order of the trace stream. The directory reads back with
``datasets.load_dataset("parquet", data_files=f"{dir}/*.parquet")`` as well as with this class.
"""
from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq

from sao_harness.core.errors import UserError
from sao_harness.core.files import atomic_write
from sao_harness.harness.trace import Trajectory, to_table

SHARD_GLOB = "shard-*.parquet"


class TraceWriteError(UserError, OSError):
    """A shard could not be written (the disk is full or refuses): the run cannot store what it produces. An
    OSError still (what the store raised before), and a UserError: the CLI says it in one line."""


class TraceStore:
    def __init__(self, root: str | Path):
        """``root`` is a run directory (traces go in ``root/traces``) or a ``traces`` directory itself."""
        root = Path(root)
        self.dir = root if root.name == "traces" else root / "traces"

    def write(self, trajectories: list[Trajectory]) -> Path:
        """Validate and write ``trajectories`` as one new shard; return its path. ``TraceWriteError`` when the
        disk refuses (full, read-only): nothing of the shard is left, the shards already there are untouched."""
        if not trajectories:
            raise ValueError("TraceStore.write: no trajectories")
        table = to_table(trajectories)
        name = f"shard-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.parquet"
        final = self.dir / name
        try:
            atomic_write(final, lambda f: pq.write_table(table, f, compression="zstd"))
        except OSError as e:
            raise TraceWriteError(f"cannot write a trace shard to {self.dir}: {e} (the shards already there are "
                                  "whole: free space there and run the same command again to resume)") from e
        return final

    def shards(self) -> list[Path]:
        return sorted(self.dir.glob(SHARD_GLOB)) if self.dir.is_dir() else []

    def read_shard(self, path: str | Path) -> list[Trajectory]:
        return read_shard(path)

    def __iter__(self) -> Iterator[Trajectory]:
        for shard in self.shards():
            yield from read_shard(shard)

    def __len__(self) -> int:
        return sum(pq.ParquetFile(s).metadata.num_rows for s in self.shards())

    def traj_ids(self) -> list[str]:
        ids: list[str] = []
        for shard in self.shards():
            ids.extend(pq.read_table(shard, columns=["traj_id"]).column("traj_id").to_pylist())
        return ids

    def clean_partial(self) -> int:
        """Remove temporary files left by a writer that died mid-write; return how many."""
        n = 0
        for tmp in self.dir.glob(".shard-*.tmp") if self.dir.is_dir() else []:
            tmp.unlink()
            n += 1
        return n


def read_shard(path: str | Path) -> list[Trajectory]:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"trace file not found: {path}")
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as e:  # pyarrow raises several types for a file that is not Parquet
        raise UserError(f"{path}: not a readable Parquet trace shard ({e})") from None
    return [Trajectory.from_row(r) for r in rows]


def read_traces(path: str | Path) -> list[Trajectory]:
    """Trajectories from a shard file, a ``traces`` directory or a run directory."""
    path = Path(path)
    if path.is_file():
        return read_shard(path)
    if path.is_dir():
        store = TraceStore(path)
        if not store.shards():
            raise UserError(f"no trace shards ({SHARD_GLOB}) under {store.dir}")
        return list(store)
    raise UserError(f"trace path not found: {path}")
