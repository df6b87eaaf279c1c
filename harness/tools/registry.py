"""Tool registration: the specs an ``Agent`` takes resolve to the SDK's tools with this episode's executors.

Contract:
- ``SandboxTools(target)`` holds one episode's executors (``.terminal``, ``.file_editor``) and
  registers them under ``.key``; ``.tool_specs()`` are the ``openhands.sdk.Tool`` specs an ``Agent``
  takes. They resolve to the SDK's ``TerminalTool`` / ``FileEditorTool`` definitions (same names,
  schemas, descriptions and observation texts); ``.close()`` ends the shell and removes the host
  scratch directories.
- ``.tool_specs(profile="compact")``: the same tools (and ``finish`` / ``think``, which the agent then
  does not add itself) with the short descriptions of ``COMPACT_TOOLS``: same names, parameters,
  types and behaviour; only the texts the LLM reads differ.
- ``.failure``: the ``SandboxUnavailable`` a tool hit. The SDK turns any tool exception into an
  error the agent sees and goes on, so the caller ends the episode itself (``harness.agent`` does,
  before the next LLM request) and counts it as an infrastructure failure.
"""
from __future__ import annotations

import shutil
import threading
import uuid
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, ClassVar

from openhands.sdk.tool import Tool, register_tool
from openhands.sdk.tool.builtins import FinishAction, FinishTool, ThinkAction, ThinkTool
from openhands.tools.file_editor import FileEditorTool
from openhands.tools.file_editor.definition import CommandLiteral, FileEditorAction
from openhands.tools.file_editor.impl import FileEditorExecutor
from openhands.tools.terminal import TerminalTool
from openhands.tools.terminal.definition import TerminalAction
from pydantic import Field

from sao_harness.harness.tools.file_editor import SandboxFileEditorExecutor
from sao_harness.harness.tools.target import SandboxTarget, SandboxUnavailable
from sao_harness.harness.tools.terminal import MAX_COMMAND_S, SandboxTerminalExecutor

_BINDINGS: dict[str, SandboxTools] = {}
_BINDINGS_LOCK = threading.Lock()


def _binding(key: str) -> SandboxTools:
    with _BINDINGS_LOCK:
        b = _BINDINGS.get(key)
    if b is None:
        raise KeyError(f"no live sandbox tools under key {key!r} (closed already?)")
    return b


# ------------------------------------------------------------------------------ compact profile
SUMMARY = "a few words on what this call does"


class CompactTerminalAction(TerminalAction):
    """``TerminalAction`` with short parameter descriptions (compact profile)."""

    command: str = Field(description="the bash command; with is_input, text or a key (C-c, ENTER) for the "
                         "running process")
    is_input: bool = Field(default=False, description="send command as input to the running process")
    timeout: float | None = Field(default=None, ge=0, description="seconds before the command is interrupted")
    reset: bool = Field(default=False, description="restart the shell")
    summary: str | None = Field(default=None, description=SUMMARY)


class CompactFileEditorAction(FileEditorAction):
    """``FileEditorAction`` with short parameter descriptions (compact profile)."""

    command: CommandLiteral = Field(description="view, create, str_replace, insert or undo_edit")
    path: str = Field(description="absolute path")
    file_text: str | None = Field(default=None, description="create: the file's content")
    old_str: str | None = Field(default=None, description="str_replace: text that occurs exactly once")
    new_str: str | None = Field(default=None, description="str_replace: its replacement; insert: the text")
    insert_line: int | None = Field(default=None, ge=0, description="insert: after this line")
    view_range: list[int] | None = Field(default=None, description="view: [first, last] line, -1 = end")
    summary: str | None = Field(default=None, description=SUMMARY)


class CompactFinishAction(FinishAction):
    message: str = Field(description="what was done")
    summary: str | None = Field(default=None, description=SUMMARY)


class CompactThinkAction(ThinkAction):
    thought: str = Field(description="the thought")
    summary: str | None = Field(default=None, description=SUMMARY)


# tool name -> (description, action type) of the compact profile
COMPACT_TOOLS = {
    "terminal": ("Run a bash command in a persistent shell.", CompactTerminalAction),
    "file_editor": ("View (cat -n), create or edit files. str_replace replaces old_str, which must occur exactly "
                    "once, by new_str.", CompactFileEditorAction),
    "finish": ("Call when the task is done.", CompactFinishAction),
    "think": ("Think step by step; changes nothing.", CompactThinkAction),
}


def compact(tools: Sequence) -> list:
    """``tools`` with the compact profile's descriptions and parameter texts (same names, types, executors)."""
    out = []
    for t in tools:
        description, action_type = COMPACT_TOOLS[t.name]
        out.append(t.model_copy(update={"description": description, "action_type": action_type}))
    return out


def _profiled(tools: Sequence, profile: str) -> Sequence:
    return compact(tools) if profile == "compact" else tools


class SandboxTerminalFactory(TerminalTool):
    """Resolves to the SDK's ``TerminalTool`` with this episode's in-container executor."""

    name: ClassVar[str] = "sandbox_terminal_factory"
    user_selectable: ClassVar[bool] = False

    @classmethod
    def create(cls, conv_state, sandbox: str, profile: str = "openhands", **_: Any) -> Sequence[TerminalTool]:
        return _profiled(TerminalTool.create(conv_state, executor=_binding(sandbox).terminal), profile)


class SandboxFileEditorFactory(FileEditorTool):
    """Resolves to the SDK's ``FileEditorTool`` (description naming the container workdir) with this
    episode's in-container executor."""

    name: ClassVar[str] = "sandbox_file_editor_factory"
    user_selectable: ClassVar[bool] = False

    @classmethod
    def create(cls, conv_state, sandbox: str, profile: str = "openhands", **_: Any) -> Sequence[FileEditorTool]:
        b = _binding(sandbox)
        view = SimpleNamespace(workspace=SimpleNamespace(working_dir=b.target.workdir), agent=conv_state.agent)
        tools = FileEditorTool.create(view)
        out = []
        for t in tools:  # drop the host executor the SDK made for the description; use ours
            if isinstance(t.executor, FileEditorExecutor):
                hist = getattr(t.executor.editor._history_manager.cache, "directory", None)
                if hist is not None:
                    shutil.rmtree(hist, ignore_errors=True)
            out.append(t.set_executor(b.file_editor))
        return _profiled(out, profile)


class CompactFinishFactory(FinishTool):
    """The SDK's ``FinishTool`` with the compact profile's texts."""

    name: ClassVar[str] = "sao_compact_finish_factory"
    user_selectable: ClassVar[bool] = False

    @classmethod
    def create(cls, conv_state=None, **_: Any) -> Sequence[FinishTool]:
        return compact(FinishTool.create(conv_state))


class CompactThinkFactory(ThinkTool):
    """The SDK's ``ThinkTool`` with the compact profile's texts."""

    name: ClassVar[str] = "sao_compact_think_factory"
    user_selectable: ClassVar[bool] = False

    @classmethod
    def create(cls, conv_state=None, **_: Any) -> Sequence[ThinkTool]:
        return compact(ThinkTool.create(conv_state))


TERMINAL_SPEC_NAME = "SaoSandboxTerminal"
FILE_EDITOR_SPEC_NAME = "SaoSandboxFileEditor"
COMPACT_FINISH_SPEC_NAME = "SaoCompactFinish"
COMPACT_THINK_SPEC_NAME = "SaoCompactThink"
register_tool(TERMINAL_SPEC_NAME, SandboxTerminalFactory)
register_tool(FILE_EDITOR_SPEC_NAME, SandboxFileEditorFactory)
register_tool(COMPACT_FINISH_SPEC_NAME, CompactFinishFactory)
register_tool(COMPACT_THINK_SPEC_NAME, CompactThinkFactory)


class SandboxTools:
    """One episode's in-container terminal and file editor, registered for tool resolution."""

    def __init__(self, target: SandboxTarget, no_change_timeout_seconds: int | None = None,
                 max_command_s: float = MAX_COMMAND_S):
        self.target = target
        self.key = uuid.uuid4().hex
        self.terminal = SandboxTerminalExecutor(target, no_change_timeout_seconds, max_command_s)
        try:
            self.file_editor = SandboxFileEditorExecutor(target)
        except BaseException:
            self.terminal.close()
            raise
        with _BINDINGS_LOCK:
            _BINDINGS[self.key] = self

    @property
    def failure(self) -> SandboxUnavailable | None:
        """The sandbox failure a tool hit, if any. The SDK shows a tool's exception to the agent as an
        error and goes on; the caller ends the episode on it (``harness.agent`` stops the next LLM call)."""
        return self.terminal.failure or self.file_editor.failure

    def tool_specs(self, profile: str = "openhands") -> list[Tool]:
        """The agent's tool specs; ``compact``: also ``finish`` and ``think`` (see the module doc)."""
        if profile == "compact":
            return [Tool(name=TERMINAL_SPEC_NAME, params={"sandbox": self.key, "profile": profile}),
                    Tool(name=FILE_EDITOR_SPEC_NAME, params={"sandbox": self.key, "profile": profile}),
                    Tool(name=COMPACT_FINISH_SPEC_NAME), Tool(name=COMPACT_THINK_SPEC_NAME)]
        return [Tool(name=TERMINAL_SPEC_NAME, params={"sandbox": self.key}),
                Tool(name=FILE_EDITOR_SPEC_NAME, params={"sandbox": self.key})]

    def close(self) -> None:
        with _BINDINGS_LOCK:
            _BINDINGS.pop(self.key, None)
        for ex in (self.terminal, self.file_editor):
            try:
                ex.close()
            except Exception:
                pass

    def __enter__(self) -> SandboxTools:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
