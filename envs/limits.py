"""Host-resource limits of a sandbox that Docker does not give on every storage driver.

Contract:
- ``DiskWatchdog(api, container_id, budget, interval_s, volume=None, layer=True)``: a daemon thread that polls
  ``disk_usage`` every ``interval_s`` and SIGKILLs the container once it exceeds ``budget`` bytes;
  ``.exceeded`` is then the usage it saw. ``stop()`` ends it. A poll: a burst of ``fallocate`` calls
  overshoots it by what they allocate in one interval, hence the hard cap below where there is one.
- ``hard_disk_cap(client, budget)``: ``containers.create`` keyword arguments that cap what the
  container writes at ``budget`` bytes, enforced by the kernel on every write and ``fallocate``
  (``storage_opt={"size": ...}``: a qgroup limit on the ``btrfs`` storage driver; with the project
  engine's simple quotas a container is charged for its own writes only, not its image's files);
  ``{}`` where the engine's driver has no such limit (overlay2 on ext4): the watchdog is then the bound.
- ``disk_usage(api, container_id, volume, layer=True)``: the writable layer's size as the engine counts
  it (``SizeRw``, apparent sizes: a sparse file counts in full; ``layer=False``: not counted, for a
  layer under a hard cap) plus the volume's blocks when its mount point is on this host.
- ``PatchTooLarge`` / ``DiskLimitExceeded``: the agent's doing (reward 0), not infrastructure.
"""
from __future__ import annotations

import os
import threading

from sao_harness.envs.errors import ContainerDied, SandboxError

HARD_CAP_DRIVERS = ("btrfs",)  # storage drivers whose `--storage-opt size` is a hard cap on every write


def hard_disk_cap(client, budget: int) -> dict:
    """See the module doc. The engine's storage driver is asked once per client."""
    driver = getattr(client, "sao_storage_driver", None)
    if driver is None:
        driver = client.sao_storage_driver = client.info().get("Driver")
    if driver not in HARD_CAP_DRIVERS:
        return {}
    return {"storage_opt": {"size": str(budget)}}


class PatchTooLarge(SandboxError):
    """The work tree's diff is over ``sandbox.max_patch_bytes`` (the agent's doing: reward 0)."""


class PatchUnavailable(SandboxError):
    """The sandbox, still running, gave no patch: the agent broke what the diff is made or read with
    (deleted .git, replaced git, head or wc; as root it can). The agent's doing: reward 0."""


class DiskLimitExceeded(ContainerDied):
    """The watchdog killed the sandbox: its disk use went over ``sandbox.disk_bytes`` (the agent's doing)."""


def disk_usage(api, container_id: str, volume=None, layer: bool = True) -> int:
    """Bytes the sandbox holds on the host (see the module doc)."""
    used = 0
    if layer:  # SizeRw: cheap on overlay2 (the upper dir), a walk of the whole tree on btrfs
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

    def __init__(self, api, container_id: str, budget: int, interval_s: float, volume=None, name: str = "",
                 layer: bool = True):
        self.api, self.container_id, self.budget, self.interval_s, self.volume, self.layer = (
            api, container_id, budget, interval_s, volume, layer)
        self.exceeded: int | None = None
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"disk-watchdog-{name}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                used = disk_usage(self.api, self.container_id, self.volume, self.layer)
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
