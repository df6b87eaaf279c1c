"""Config sections for the Docker engine (`docker.*`) and the sandboxes (`sandbox.*`)."""
from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class DockerConfig(_Section):
    # Use an engine that already answers; otherwise start the project's own dockerd (as root).
    host: str | None = None  # DOCKER_HOST to use; None = environment / default socket / project engine
    state_dir: Path = Path("/var/lib/sao-harness/docker")  # project engine: data root, exec root, socket
    base_image: str | None = None  # None = the project's debootstrap image; or any local image name
    image_cache_dir: Path | None = None  # optional `docker save` tarball cache of the base image
    start_timeout_s: float = Field(60.0, gt=0)  # wait this long for a started dockerd to answer
    # Start the project dockerd in its own network namespace (`unshare --net`): None = only when
    # another engine's docker0 link exists (ours would delete it); True/False force it.
    netns: bool | None = None
    mirror: str | None = None  # Debian mirror for the base image; None = the host apt's mirror
    suite: str = "bookworm"  # Debian release of the base image (its Python is 3.11)


_MEM = re.compile(r"^\d+(\.\d+)?[bkmg]?$", re.IGNORECASE)
_CAP = re.compile(r"^[A-Z_]+$")


class SandboxConfig(_Section):
    memory: str = "2g"  # hard limit, swap included (memory-swap = memory)
    cpus: float = Field(1.0, gt=0)
    pids_limit: int = Field(512, gt=0)
    network: str = "none"  # docker network mode; the project engine has only "none" and "host"
    cap_add: list[str] = []  # capabilities granted back after --cap-drop ALL (e.g. for apt)
    user: str | None = None  # "uid:gid" or a name; None = the image's user
    workdir: str = "/testbed"
    command_timeout_s: float = Field(120.0, gt=0)
    output_cap_chars: int = Field(30_000, gt=0)
    read_only: bool = False  # read-only root filesystem; /tmp and the workdir stay writable
    tmpfs_size: str = "512m"  # size of the /tmp tmpfs when read_only
    shm_size: str = "64m"
    env: dict[str, str] = {}  # environment of the sandbox's shell and processes
    start_timeout_s: float = Field(30.0, gt=0)  # container create + start + shell ready

    @field_validator("memory", "tmpfs_size", "shm_size")
    @classmethod
    def _size(cls, v: str) -> str:
        if not _MEM.match(v):
            raise ValueError("must be a size like 512m or 2g")
        return v

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
