"""Pins of the OpenHands SDK internals the sandbox tools (``harness/tools/``) rely on.

``harness.tools.terminal`` subclasses the SDK's PTY terminal and terminal executor, overrides private
methods and bypasses the executor's ``__init__``; ``harness.tools.file_editor`` reads private
``FileEditor`` attributes and re-creates three of its texts; ``harness.tools.registry`` calls
``FileEditorTool.create`` with a stand-in conversation state. An SDK upgrade that changes any of these
fails here with a message naming what changed (no Docker needed).
"""
from __future__ import annotations

import ast
import importlib.metadata
import inspect
import shutil
import tempfile
import textwrap
from pathlib import Path

from openhands.sdk import LLM
from openhands.sdk.tool import ToolDefinition
from openhands.tools.file_editor import FileEditorTool
from openhands.tools.file_editor.definition import FileEditorObservation
from openhands.tools.file_editor.editor import FileEditor
from openhands.tools.file_editor.exceptions import EditorToolParameterInvalidError
from openhands.tools.file_editor.impl import FileEditorExecutor
from openhands.tools.terminal import TerminalTool
from openhands.tools.terminal.constants import CMD_OUTPUT_PS1_END
from openhands.tools.terminal.impl import TerminalExecutor
from openhands.tools.terminal.terminal.interface import TerminalInterface
from openhands.tools.terminal.terminal.subprocess_terminal import ENTER, SubprocessTerminal
from openhands.tools.terminal.terminal.terminal_session import TerminalSession

from sao_harness.harness.tools import SandboxTarget
from sao_harness.harness.tools.terminal import DockerExecTerminal, SandboxTerminalExecutor

SDK_VERSION = importlib.metadata.version("openhands-tools")

# (class, method, parameter names): methods harness.tools (and harness.agent's EpisodeLLM) overrides
# (the SDK calls them) or calls.
SIGNATURES = [
    (SubprocessTerminal, "__init__", ["self", "work_dir", "username", "shell_path", "env"]),
    (SubprocessTerminal, "initialize", ["self"]),
    (SubprocessTerminal, "close", ["self"]),
    (SubprocessTerminal, "interrupt", ["self"]),
    (SubprocessTerminal, "clear_screen", ["self"]),
    (SubprocessTerminal, "_write_pty", ["self", "data"]),
    (SubprocessTerminal, "_read_output_continuously_pty", ["self"]),
    (SubprocessTerminal, "_wait_for_pty_writable", ["self", "timeout"]),
    (SubprocessTerminal, "_add_text_to_buffer", ["self", "text"]),
    (TerminalSession, "__init__", ["self", "terminal", "no_change_timeout_seconds"]),
    (TerminalSession, "initialize", ["self"]),
    (TerminalSession, "close", ["self"]),
    (TerminalExecutor, "__call__", ["self", "action", "conversation"]),
    (TerminalExecutor, "reset", ["self"]),
    (TerminalExecutor, "_initialize_pool", ["self"]),
    (TerminalExecutor, "_reset_single_session", ["self"]),
    (TerminalExecutor, "_execute_single_session", ["self", "action", "conversation"]),
    (FileEditorExecutor, "__init__", ["self", "workspace_root", "allowed_edits_files"]),
    (FileEditorExecutor, "__call__", ["self", "action", "conversation"]),
    (ToolDefinition, "set_executor", ["self", "executor"]),
    (LLM, "post_response_prompt_mock", ["self", "resp", "nonfncall_msgs", "tools", "include_security_params"]),
]
# Source fragments the overrides assume: (class, method or None for the whole class, fragment, why).
SOURCE_FRAGMENTS = [
    (TerminalExecutor, "__call__", "self._execute_single_session(",
     "a command without a tmux pool runs through _execute_single_session"),
    (TerminalExecutor, "_execute_single_session", "self._reset_single_session()",
     "reset=true and a closed session go through _reset_single_session (overridden: shell in the container)"),
    (TerminalExecutor, "_execute_single_session", "self.session._closed",
     "a closed session is reset before the command runs"),
    (TerminalExecutor, "reset", "self._reset_single_session()", "reset() goes through _reset_single_session"),
    (SubprocessTerminal, "_read_output_continuously_pty", "self._add_text_to_buffer(",
     "PTY output reaches the buffer through _add_text_to_buffer (overridden: drops CR)"),
    (SubprocessTerminal, "_send_multiline_with_flow_control", "self._wait_for_pty_writable(",
     "a multi-line command waits for the PTY through _wait_for_pty_writable (overridden: poll, not select)"),
    (FileEditor, None, "while trying to read", "the permission-denied text re-created for unreadable files"),
    (FileEditor, None, "while trying to write to", "the failed-write text re-created when the container refuses"),
    (FileEditor, None, "The path should be an absolute path.", "the relative-path error re-created"),
    (FileEditor, None, " Maybe you meant ", "the relative-path error re-created"),
]
# Terminal state the overrides read or write (set by SubprocessTerminal / TerminalInterface __init__).
TERMINAL_STATE = ["PS1", "process", "_pty_master_fd", "output_buffer", "output_lock", "reader_thread",
                  "_current_command_running", "_initialized", "_closed"]
# SandboxTerminalExecutor's own attributes
OWN_EXECUTOR_STATE = {"target", "sessions_started", "failure", "max_command_s"}


def _self_assignments(fn) -> set[str]:
    """Names of the ``self.<name> = ...`` assignments in ``fn``'s source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    names = set()
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                names.add(t.attr)
    return names


def _conv_state_reads(fn) -> set[str]:
    """First-level attributes ``fn`` reads from its ``conv_state`` argument."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    return {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "conv_state"}


def signature_problems() -> list[str]:
    problems = []
    for cls, meth, params in SIGNATURES:
        fn = getattr(cls, meth, None)
        if fn is None:
            problems.append(f"{cls.__qualname__}.{meth} is gone")
            continue
        names = list(inspect.signature(fn).parameters)
        if names != params:
            problems.append(f"{cls.__qualname__}.{meth} now takes ({', '.join(names)}), "
                            f"pinned ({', '.join(params)})")
    return problems


def source_problems() -> list[str]:
    problems = []
    for cls, meth, fragment, why in SOURCE_FRAGMENTS:
        where = cls.__qualname__ + (f".{meth}" if meth else "")
        fn = getattr(cls, meth, None) if meth else cls
        if fn is None:
            problems.append(f"{where} is gone ({why})")
        elif fragment not in inspect.getsource(fn):
            problems.append(f"{where} no longer contains {fragment!r} ({why})")
    return problems


def executor_init_problems() -> list[str]:
    """``SandboxTerminalExecutor.__init__`` sets the SDK executor's state itself (the SDK's starts a host shell)."""
    sdk = _self_assignments(TerminalExecutor.__init__)
    ours = _self_assignments(SandboxTerminalExecutor.__init__) - OWN_EXECUTOR_STATE
    problems = []
    if sdk - ours:
        problems.append(f"TerminalExecutor.__init__ now sets {sorted(sdk - ours)}, which "
                        "SandboxTerminalExecutor.__init__ (it bypasses the SDK's) does not set")
    if ours - sdk:
        problems.append(f"TerminalExecutor.__init__ no longer sets {sorted(ours - sdk)}, which "
                        "SandboxTerminalExecutor.__init__ still sets (renamed?)")
    return problems


def state_problems() -> list[str]:
    problems = []
    term = DockerExecTerminal(SandboxTarget(container="sdk-pin-test"))  # no Docker call until initialize()
    problems += [f"SubprocessTerminal instances no longer have {a!r}" for a in TERMINAL_STATE if not hasattr(term, a)]
    if hasattr(term, "PS1") and term.PS1.strip().split("\n")[-1] != CMD_OUTPUT_PS1_END.strip():
        problems.append("the PS1 prompt no longer ends with CMD_OUTPUT_PS1_END (the shell-ready wait looks for it)")
    if not isinstance(inspect.getattr_static(TerminalInterface, "closed", None), property):
        problems.append("TerminalInterface.closed is no longer a property (DockerExecTerminal overrides it as one)")
    if ENTER != b"\n":
        problems.append(f"subprocess_terminal.ENTER is now {ENTER!r}, pinned b'\\n'")
    if not isinstance(getattr(TerminalExecutor, "_RESET_TEXT", None), str):
        problems.append("TerminalExecutor._RESET_TEXT (the reset observation text) is gone")
    root = tempfile.mkdtemp(prefix="sao-sdk-pin-")
    try:
        editor = FileEditorExecutor(workspace_root=root).editor
        if not isinstance(getattr(editor, "_max_file_size", None), int):
            problems.append("FileEditor._max_file_size (the probe's fetch limit) is gone or not an int")
        hist = getattr(getattr(getattr(editor, "_history_manager", None), "cache", None), "directory", None)
        if not isinstance(hist, Path):
            problems.append("FileEditor._history_manager.cache.directory (removed on close) is gone")
        else:
            shutil.rmtree(hist, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    message = EditorToolParameterInvalidError("path", "ed/x.py", "hint").message
    if message != "Invalid `path` parameter: ed/x.py. hint":
        problems.append(f"EditorToolParameterInvalidError's message is now {message!r}")
    obs = FileEditorObservation.from_text(text="t", command="view", is_error=True)
    if (obs.text, obs.is_error, obs.path) != ("t", True, None):
        problems.append("FileEditorObservation.from_text(text=, command=, is_error=) builds something else")
    return problems


def registry_problems() -> list[str]:
    problems = []
    reads = _conv_state_reads(FileEditorTool.create.__func__)
    if not reads <= {"workspace", "agent"}:
        problems.append(f"FileEditorTool.create now reads conv_state.{sorted(reads - {'workspace', 'agent'})}; "
                        "SandboxFileEditorFactory passes a stand-in with workspace and agent only")
    if "executor" not in inspect.signature(TerminalTool.create).parameters:
        problems.append("TerminalTool.create no longer takes executor=")
    if not hasattr(ToolDefinition, "user_selectable"):
        problems.append("ToolDefinition.user_selectable is gone")
    return problems


def all_problems() -> list[str]:
    return (signature_problems() + source_problems() + executor_init_problems() + state_problems()
            + registry_problems())


def test_sdk_internals_used_by_the_sandbox_tools_are_unchanged():
    problems = all_problems()
    assert not problems, (f"openhands-tools {SDK_VERSION} changed what harness/tools/ relies on:\n- "
                          + "\n- ".join(problems))


# The pins have power: each kind of change is caught and named.

def test_a_removed_private_method_is_named(monkeypatch):
    monkeypatch.delattr(SubprocessTerminal, "_write_pty")
    assert "SubprocessTerminal._write_pty is gone" in all_problems()


def test_a_changed_signature_is_named(monkeypatch):
    def _add_text_to_buffer(self, text, stream="stdout"):
        pass

    monkeypatch.setattr(SubprocessTerminal, "_add_text_to_buffer", _add_text_to_buffer)
    assert any(p.startswith("SubprocessTerminal._add_text_to_buffer now takes (self, text, stream)")
               for p in all_problems())


def test_new_state_of_the_bypassed_executor_init_is_named(monkeypatch):
    original = TerminalExecutor.__init__

    def __init__(self, working_dir):
        original(self, working_dir)
        self._retry_budget = 3

    monkeypatch.setattr(TerminalExecutor, "__init__", __init__)
    assert any(p.startswith("TerminalExecutor.__init__ now sets ['_retry_budget']") for p in executor_init_problems())


def test_a_changed_dispatch_is_named(monkeypatch):
    def reset(self):
        return self._reset_session()

    monkeypatch.setattr(TerminalExecutor, "reset", reset)
    assert any(p.startswith("TerminalExecutor.reset no longer contains 'self._reset_single_session()'")
               for p in all_problems())


def test_a_new_conversation_state_read_is_named(monkeypatch):
    def create(cls, conv_state):
        return conv_state.workspace.working_dir, conv_state.persistence_dir

    monkeypatch.setattr(FileEditorTool, "create", classmethod(create))
    assert any("persistence_dir" in p for p in registry_problems())

