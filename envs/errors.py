"""Typed faults of the Docker layer; each message names the reason.

``SandboxError`` is the base; the harness treats any of them as an infrastructure failure (never a
reward), except ``CommandTimeout`` and ``OOMKilled``, which a caller may count as the agent's doing.
"""
from __future__ import annotations


class SandboxError(Exception):
    """Base of every envs fault."""


class EngineError(SandboxError):
    """No Docker engine could be used or started (message says how to get one)."""


class EngineGone(EngineError):
    """The engine stopped answering (socket missing, daemon dead) while in use."""


class ImageNotFound(SandboxError):
    """An image that does not exist locally (no registry is ever consulted)."""

    def __init__(self, image: str):
        super().__init__(f"image not found: {image!r} (build it first, e.g. `sao docker base`)")
        self.image = image


class ImageBuildError(SandboxError):
    """Building or importing an image failed (message quotes the failing step's output)."""


class ContainerDied(SandboxError):
    """The sandbox's container stopped or vanished while in use."""

    def __init__(self, message: str, output: str = "", exit_code: int | None = None):
        super().__init__(message)
        self.output = output
        self.exit_code = exit_code


class OOMKilled(SandboxError):
    """A process (or the whole container) was killed for passing the memory limit.

    ``container_died`` tells which: when False the sandbox is still usable.
    """

    def __init__(self, message: str, output: str = "", exit_code: int | None = None,
                 container_died: bool = False):
        super().__init__(message)
        self.output = output
        self.exit_code = exit_code
        self.container_died = container_died


class CommandTimeout(SandboxError):
    """A command ran past its timeout; its process tree was killed and the shell stays usable."""

    def __init__(self, command: str, timeout_s: float, output: str = ""):
        short = command if len(command) <= 80 else command[:77] + "..."
        super().__init__(f"command timed out after {timeout_s:g} s: {short!r}")
        self.command = command
        self.timeout_s = timeout_s
        self.output = output
