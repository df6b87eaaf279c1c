"""Config sections for the Docker engine (`docker.*`) and the sandboxes (`sandbox.*`)."""
from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from sao_harness.core.config import Section
from sao_harness.core.slots import slots_or_per_core


class DockerConfig(Section):
    """The Docker engine: an engine that already answers, else the project's own dockerd (as root)."""

    host: str | None = Field(None, description="DOCKER_HOST to use; null = the environment's, the default "
                             "socket, or the project engine")
    state_dir: Path = Field(Path("/var/lib/sao-harness/docker"),
                            description="the project engine's data root, exec root and socket")
    base_image: str | None = Field(None, description="image tasks build on; null = the project's debootstrap "
                                   "image, or any local image name")
    image_cache_dir: Path | None = Field(None, description="optional `docker save` tarball cache of the base "
                                         "image (null = no cache)")
    start_timeout_s: float = Field(60.0, gt=0, description="seconds to wait for a started dockerd to answer")
    netns: bool | None = Field(None, description="start the project dockerd in its own network namespace "
                               "(`unshare --net`); null = only when another engine's docker0 link exists "
                               "(ours would delete it); true / false force it")
    mirror: str | None = Field(None, description="Debian mirror for the base image; null = the host apt's mirror")
    suite: str = Field("bookworm", description="Debian release of the base image (its Python is 3.11)")
    disk_quota: bool = Field(False, description="true: the project engine keeps its data root on a btrfs "
                             "filesystem of its own (a sparse file in state_dir, simple quotas, Linux >= 6.7) so "
                             "the kernel caps every container's writes at sandbox.disk_bytes; ~1 s more per "
                             "episode (container create/remove, grading). false: the host filesystem, the disk "
                             "watchdog alone")
    data_fs_size: str = Field("64g", description="size of that filesystem (sparse: it takes host disk as it fills)")
    image_sources: list[str] = Field(["registry"], description="where a missing task image is fetched from, in "
                                     "order (envs.pull): registry (docker pull), dir:/ABS/PATH (a directory of "
                                     "`docker save` tarballs, `sao images save`), engine:URL (docker save from "
                                     "another engine, e.g. engine:unix:///path/docker.sock, into docker load here)")
    image_cache_bytes: str | None = Field(None, description="disk budget of the task images fetched here (sizes as "
                                          "Docker reports them); past it the least recently used are removed (never "
                                          "the base image, never one a container uses); null or 0 = no limit")
    pull_concurrency: int = Field(4, gt=0, description="images fetched at once by `sao images pull`, per node")
    pull_retries: int = Field(3, ge=0, description="retries of a failed fetch from a source (a source that lacks "
                              "the image is skipped at once)")
    pull_backoff_s: float = Field(2.0, ge=0, description="seconds before the first retry; doubled for each next one")

    @field_validator("data_fs_size")
    @classmethod
    def _size(cls, v: str) -> str:
        return _size_text(v)

    @field_validator("image_cache_bytes", mode="before")
    @classmethod
    def _cache_size(cls, v):
        return None if v is None else _size_text(str(v))  # a plain number of bytes is a size too

    @field_validator("image_sources")
    @classmethod
    def _sources(cls, v: list[str]) -> list[str]:
        for src in v:
            kind, _, arg = src.partition(":")
            if src == "registry" or (kind == "dir" and arg.startswith("/")) or (kind == "engine" and "://" in arg):
                continue
            raise ValueError(f"{src!r} is not an image source: registry, dir:/ABS/PATH or engine:URL "
                             "(engine:unix:///path/docker.sock)")
        if not v:
            raise ValueError("is empty: name at least one source (registry, dir:/ABS/PATH, engine:URL)")
        return v


_MEM = re.compile(r"^\d+(\.\d+)?[bkmg]?$", re.IGNORECASE)
_CAP = re.compile(r"^[A-Z_]+$")


def _size_text(v: str) -> str:
    """A Docker size string (``512m``, ``2g``, ``100``), checked."""
    if not _MEM.match(v):
        raise ValueError("must be a size like 512m or 2g")
    return v


class SandboxConfig(Section):
    """One sandbox container per episode: its limits, user, environment and command timeouts."""

    memory: str = Field("2g", description="memory limit, swap included (memory-swap = memory)")
    cpus: float = Field(1.0, gt=0, description="CPU limit per sandbox")
    pids_limit: int = Field(512, gt=0, description="process limit per sandbox (bounds fork bombs)")
    network: str = Field("none", description='docker network mode; must be "none" unless allow_network is true')
    allow_network: bool = Field(False, description="allow a network mode other than none (e.g. host: the sandbox "
                                "then shares the host's network); logs a warning")
    cap_add: list[str] = Field([], description="capabilities granted back after `--cap-drop ALL` (e.g. for apt)")
    user: str | None = Field(None, description='"uid:gid" or a user name; null = the image\'s user')
    workdir: str = Field("/testbed", description="working directory of the shell (the task's repository)")
    command_timeout_s: float = Field(120.0, gt=0, description="per-command timeout; past it the command's "
                                     "process group is killed")
    output_cap_chars: int = Field(30_000, gt=0, description="output kept per command, with a marker saying how "
                                  "much was cut")
    read_only: bool = Field(False, description="read-only root filesystem; /tmp and the workdir stay writable")
    tmpfs_size: str = Field("512m", description="size of the /tmp tmpfs when read_only")
    shm_size: str = Field("64m", description="size of /dev/shm")
    env: dict[str, str] = Field({}, description="environment of the sandbox's shell and processes")
    start_timeout_s: float = Field(120.0, gt=0, description="seconds for the sandbox's shell to answer once its "
                                   "container started (one idle start: ~0.5 s; 16 at once on 2 busy cores: p99 4 s)")
    start_slots: int = Field(0, ge=0, description="sandboxes starting at once on one node, across its processes "
                             "(core.slots): a start past them waits (timings.sandbox_wait_s) before its "
                             "start_timeout_s begins; 0: four per CPU core of the node")
    disk_bytes: str = Field("10g", description="disk budget of the sandbox's writable layer (and workdir volume): "
                            "no single file may exceed it (kernel file-size limit), and a watchdog kills the "
                            "sandbox once its total exceeds it (apparent sizes, sparse files count in full); on "
                            "a btrfs engine (docker.disk_quota) the kernel refuses any write past it instead, in "
                            "sandboxes and grading containers")
    disk_check_s: float = Field(0.5, gt=0, description="seconds between two disk-budget checks of the watchdog")
    max_patch_bytes: int = Field(10_000_000, gt=0, description="largest patch read back from the sandbox; a "
                                 "bigger one ends the episode as patch_too_large with reward 0")
    scrub_history: Literal["auto", "always", "never"] = Field(
        "auto", description="delete the repository's history after the task's base commit (refs, reflogs, objects) "
        "when a sandbox starts, before the agent (envs.scrub): auto = unless the image is the project's verified "
        "build of a bundled task (tasks.scrub); always; never")

    @field_validator("memory", "tmpfs_size", "shm_size", "disk_bytes")
    @classmethod
    def _size(cls, v: str) -> str:
        return _size_text(v)

    @field_validator("cap_add")
    @classmethod
    def _caps(cls, v: list[str]) -> list[str]:
        out = []
        for cap in v:
            cap = cap.upper().removeprefix("CAP_")
            if not _CAP.match(cap):
                raise ValueError(f"not a capability name: {cap!r}")
            out.append(cap)
        return out

    @model_validator(mode="after")
    def _network(self) -> SandboxConfig:
        if self.network != "none":
            if not self.allow_network:
                raise ValueError(f'sandbox.network is {self.network!r}: only "none" unless sandbox.allow_network '
                                 "is true")
            logging.getLogger(__name__).warning("sandbox.network=%r: sandboxes share that network (not isolated)",
                                                self.network)
        return self

    def slots(self) -> int:
        """``start_slots``, or four per CPU core of this node when it is 0."""
        return slots_or_per_core(self.start_slots, 4)


def size_bytes(text: str) -> int:
    """Bytes of a size like ``512m`` / ``2g`` / ``1.5k`` / ``100`` (powers of 1024, as Docker reads them)."""
    text = text.strip().lower()
    unit = text[-1] if text[-1] in "bkmg" else "b"
    return int(float(text.rstrip("bkmg")) * 1024 ** "bkmg".index(unit))
