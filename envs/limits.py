"""Host-resource limits of a sandbox that Docker does not give on every storage driver.

Contract:
- ``DiskWatchdog(api, container_id, budget, interval_s, volume=None)``: a daemon thread that polls
  ``disk_usage`` every ``interval_s`` and SIGKILLs the container once it exceeds ``budget`` bytes;
  ``.exceeded`` is then the usage it saw. ``stop()`` ends it. (overlay2 on ext4, the project engine,
  has no ``--storage-opt size``; the kernel's per-file ``RLIMIT_FSIZE`` is set by the sandbox.)
- ``disk_usage(api, container_id, volume)``: the writable layer's size as the engine counts it
  (``SizeRw``, apparent sizes: a sparse file counts in full) plus the volume's blocks when its mount
  point is on this host.
- ``PatchTooLarge`` / ``DiskLimitExceeded``: the agent's doing (reward 0), not infrastructure.
"""
from __future__ import annotations

import os
import threading

from envs.errors import ContainerDied, SandboxError


class PatchTooLarge(SandboxError):
    """The work tree's diff is over ``sandbox.max_patch_bytes`` (the agent's doing: reward 0)."""


class DiskLimitExceeded(ContainerDied):
    """The watchdog killed the sandbox: its disk use went over ``sandbox.disk_bytes`` (the agent's doing)."""


def disk_usage(api, container_id: str, volume=None) -> int:
    """Bytes the sandbox holds on the host (see the module doc)."""
    rows = api.containers(all=True, size=True, filters={"id": container_id})
    used = int(rows[0].get("SizeRw") or 0) if rows else 0
    mount = (volume.attrs.get("Mountpoint") or "") if volume is not None else ""
    if mount and os.path.isdir(mount):
        for root, _dirs, files in os.walk(mount):
            for f in files:
                try:
                    used += os.lstat(os.path.join(root, f)).st_blocks * 512
                except OSError:
                    pass
    return used


class DiskWatchdog:
    """See the module doc."""

    def __init__(self, api, container_id: str, budget: int, interval_s: float, volume=None, name: str = ""):
        self.api, self.container_id, self.budget, self.interval_s, self.volume = (
            api, container_id, budget, interval_s, volume)
        self.exceeded: int | None = None
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"disk-watchdog-{name}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                used = disk_usage(self.api, self.container_id, self.volume)
            except Exception:  # noqa: BLE001  (engine blip or container gone: the next sandbox call says so)
                continue
            if used > self.budget:
                self.exceeded = used
                try:
                    self.api.kill(self.container_id)
                except Exception:  # noqa: BLE001  (already dead)
                    pass
                return

    def stop(self) -> None:
        self._stop.set()
