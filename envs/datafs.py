"""The project engine's data root on a filesystem of its own, so a container's disk can be capped hard.

Contract:
- ``mount_data_fs(data_root, image, size, log)`` -> True when ``data_root`` is a btrfs mount (made now
  or before): a sparse file ``image`` of ``size`` bytes, formatted btrfs once and loop-mounted at
  ``data_root`` with ``discard`` (space freed inside goes back to the host), with btrfs simple
  quotas from the start (``enable_simple_quotas``). The engine then runs the
  ``btrfs`` storage driver, whose ``--storage-opt size=`` is a qgroup limit the kernel enforces on
  every write and every ``fallocate`` (overlay2 on ext4 has no such limit).
- False, with the reason logged, when that cannot be: a data root that already holds files on the
  host filesystem (never hidden under a mount), no loop device, no btrfs, a kernel without
  simple quotas (Linux < 6.7). Containers are then
  bounded by the disk watchdog alone (``envs.limits``).
- ``mounted_fstype(path)``: the filesystem type mounted exactly at ``path``, or None.
"""
from __future__ import annotations

import fcntl
import os
import struct
import subprocess
from pathlib import Path

from sao_harness.envs.errors import EngineError
from sao_harness.envs.hostpkg import ensure_programs, which


def mounted_fstype(path: Path) -> str | None:
    """The type of the filesystem mounted at ``path`` itself (the last mount there wins), or None."""
    target, fstype = os.path.realpath(path), None
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) >= 3 and parts[1].replace("\\040", " ") == target:
            fstype = parts[2]
    return fstype


BTRFS_IOC_QUOTA_CTL = 0xC0109428  # _IOWR(0x94, 40, struct btrfs_ioctl_quota_ctl_args {u64 cmd, status})
BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA = 4  # Linux >= 6.7


def enable_simple_quotas(path: Path) -> None:
    """Simple quotas on the (empty) btrfs at ``path``: a subvolume is charged for the extents it writes,
    not for those it shares with its snapshot source, and a snapshot costs no accounting (classic
    qgroups made every container create take 1-2 s). btrfs-progs 6.2 cannot ask for them: the ioctl."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, BTRFS_IOC_QUOTA_CTL, struct.pack("QQ", BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA, 0))
    except OSError as e:
        raise EngineError(f"cannot enable btrfs simple quotas on {path} (they need Linux >= 6.7): {e}") from None
    finally:
        os.close(fd)


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    if proc.returncode != 0:
        raise EngineError(f"`{' '.join(argv)}` failed (exit {proc.returncode}): {proc.stdout.strip()[-300:]}")


def mount_data_fs(data_root: Path, image: Path, size: int, log) -> bool:
    """See the module doc."""
    fstype = mounted_fstype(data_root)
    if fstype == "btrfs":
        return True
    if fstype is not None:
        log(f"docker: {data_root} is a {fstype} mount, not btrfs: containers get no hard disk cap "
            "(the disk watchdog bounds them)")
        return False
    if data_root.is_dir() and any(data_root.iterdir()):
        log(f"docker: {data_root} holds files but is no mount (never mounted over): containers get no hard "
            f"disk cap (the disk watchdog bounds them). Remove it and run `sao docker up` again for the cap")
        return False
    made = False
    try:
        ensure_programs({"mkfs.btrfs": "btrfs-progs", "btrfs": "btrfs-progs"}, log=log)
        data_root.mkdir(parents=True, exist_ok=True)
        if not image.exists():
            with open(image, "wb") as f:
                f.truncate(size)  # sparse: takes host disk only as it fills
            made = True
            _run([which("mkfs.btrfs") or "mkfs.btrfs", "-q", str(image)])
        _run([which("mount") or "mount", "-o", "loop,discard", str(image), str(data_root)])
        if made:
            enable_simple_quotas(data_root)
    except (EngineError, OSError) as e:
        if made:
            subprocess.run([which("umount") or "umount", str(data_root)], capture_output=True)
            image.unlink(missing_ok=True)
        log(f"docker: cannot give {data_root} a filesystem of its own ({e}): containers get no hard disk cap "
            "(the disk watchdog bounds them)")
        return False
    log(f"docker: data root {data_root} on btrfs in {image} (sparse, {size / 2**30:.0f} GiB at most)")
    return True
