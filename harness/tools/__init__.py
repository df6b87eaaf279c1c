"""The OpenHands SDK's own ``terminal`` and ``file_editor`` tools, executing inside a Docker sandbox.

One module per tool, as the SDK lays out its own:
- ``target``: ``SandboxTarget`` (the container and how to reach it), ``SandboxUnavailable``,
  ``SandboxBroken``;
- ``terminal``: the SDK's PTY terminal on ``docker exec -it ... bash -i`` (never a host shell);
- ``file_editor``: the SDK's ``FileEditor`` on per-call host copies of container files;
- ``registry``: ``SandboxTools(target)``, one episode's executors and the ``Tool`` specs an ``Agent`` takes.

A container that vanishes or a Docker failure raises ``SandboxUnavailable`` from an executor and is
kept in ``SandboxTools.failure``; the caller ends the episode on it as an infrastructure failure. A
running container whose tools the agent broke (no ``bash`` left, ...) raises ``SandboxBroken``: the
agent sees it as the tool's error and the episode goes on (graded, never infra).
"""
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before litellm is imported (via the SDK)
os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")

from sao_harness.harness.tools.file_editor import SandboxFileEditorExecutor
from sao_harness.harness.tools.registry import FILE_EDITOR_SPEC_NAME, TERMINAL_SPEC_NAME, SandboxTools
from sao_harness.harness.tools.target import SandboxBroken, SandboxTarget, SandboxUnavailable
from sao_harness.harness.tools.terminal import DockerExecTerminal, SandboxTerminalExecutor

__all__ = ["FILE_EDITOR_SPEC_NAME", "TERMINAL_SPEC_NAME", "DockerExecTerminal", "SandboxBroken",
           "SandboxFileEditorExecutor", "SandboxTarget", "SandboxTerminalExecutor", "SandboxTools",
           "SandboxUnavailable"]
