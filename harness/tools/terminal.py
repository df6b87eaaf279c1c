"""The terminal tool: the SDK's PTY terminal whose shell is ``docker exec -it ... bash -i`` in the sandbox.

Contract:
- ``DockerExecTerminal(target)``: the SDK's ``SubprocessTerminal`` whose child is
  ``docker exec -it -w <workdir> <container> bash -i``; the SDK's session logic (PS1 protocol,
  timeouts, ``is_input``, ``reset``) is unchanged, except that a line longer than ``MAX_LINE_CHARS``
  is cut there with ``LINE_CUT_MARKER`` as it arrives (the SDK re-joins the partial line with every
  chunk read: quadratic in a line's length; 16 MB without a newline cost a minute of host CPU).
- ``SandboxTerminalExecutor(target)``: the SDK's ``TerminalExecutor``; every shell it ever starts,
  including after ``reset=true`` or an ``exit`` typed by the agent, is a shell in the container: no
  code path can start a host shell. A dead container raises ``SandboxUnavailable`` (kept in ``.failure``);
  a running one where no shell starts any more (the agent removed ``bash``, ...) raises
  ``SandboxBroken``, which the agent sees as the command's error. Only the episode's first shell
  counts as infrastructure: before it, the agent has done nothing.
- ``max_command_s``: the wall time one terminal call may take, whatever ``timeout`` the agent asks for and
  even when the command keeps printing (the SDK then waits for it forever). Past it the command gets ^C
  through the TTY and, ``KILL_GRACE_S`` later, its shell's session is SIGKILLed; the observation says so.
- The PTY is read and waited on with ``poll`` (the SDK's ``select`` fails on a descriptor >= 1024, which a
  process running a hundred episodes at once has): ``envs.shell.wait_fd``.
- It relies on private SDK attributes and methods; ``tests/harness/test_sdk_pins.py`` pins them.
"""
from __future__ import annotations

import errno
import fcntl
import os
import pty
import secrets
import signal
import struct
import subprocess
import termios
import threading
import time

from openhands.tools.terminal.definition import TerminalObservation
from openhands.tools.terminal.impl import TerminalExecutor
from openhands.tools.terminal.terminal.subprocess_terminal import ENTER, SubprocessTerminal
from openhands.tools.terminal.terminal.terminal_session import TerminalSession

from sao_harness.envs.shell import wait_fd
from sao_harness.harness.tools.target import SandboxBroken, SandboxTarget, SandboxUnavailable

PTY_ROWS, PTY_COLS = 100, 4000
SHELL_START_TIMEOUT_S = 120.0  # docker exec -it up to the prompt: ~0.5 s idle, p99 4 s with 16 at once on 2 busy cores
# The docker CLI detaches on its detach keys (default ctrl-p,ctrl-q); make that sequence unlikely.
DETACH_KEYS = "ctrl-@,ctrl-@"
MAX_LINE_CHARS = 1 << 16
MAX_COMMAND_S = 600.0
KILL_GRACE_S = 5.0
STOPPED_NOTE = "\n[The sandbox stopped this command: one command may run for at most {s:g} seconds.]"
LINE_CUT_MARKER = "[... line cut by the sandbox: longer than {n} characters ...]"
_SHELL_ENV = {"TERM": "xterm-256color", "PAGER": "cat", "GIT_PAGER": "cat", "PS2": ""}


class DockerExecTerminal(SubprocessTerminal):
    """The SDK's PTY terminal with ``docker exec -it ... bash -i`` as its child (never a host shell)."""

    def __init__(self, target: SandboxTarget):
        super().__init__(target.workdir, username=None, shell_path=None, env=None)
        self.target = target
        self.shell_pid: int | None = None  # in the container's pid namespace; the shell leads its session
        self._cutting = False  # the current line was cut: drop text up to its newline

    def exec_argv(self) -> list[str]:
        t = self.target
        argv = [t.cli(), "exec", "-it", f"--detach-keys={DETACH_KEYS}", "-w", t.workdir]
        if t.user:
            argv += ["-u", t.user]
        for k, v in {**_SHELL_ENV, **t.env}.items():
            argv += ["-e", f"{k}={v}"]
        return argv + [t.container, "bash", "-i"]

    def initialize(self) -> None:
        if self._initialized:
            return
        master_fd, slave_fd = pty.openpty()
        fcntl.ioctl(slave_fd, termios.TIOCSWINSZ, struct.pack("HHHH", PTY_ROWS, PTY_COLS, 0, 0))
        try:
            self.process = subprocess.Popen(
                self.exec_argv(), stdin=slave_fd, stdout=slave_fd, stderr=slave_fd, env=self.target.cli_env(),
                cwd="/", bufsize=0, start_new_session=True, close_fds=True)
        finally:
            os.close(slave_fd)
        self._pty_master_fd = master_fd
        flags = fcntl.fcntl(master_fd, fcntl.F_GETFL)
        fcntl.fcntl(master_fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        self.reader_thread = threading.Thread(target=self._read_output_continuously_pty, daemon=True)
        self.reader_thread.start()
        self._initialized = True
        try:  # the CLI sizes the exec TTY from ours at start; a SIGWINCH makes sure
            os.kill(self.process.pid, signal.SIGWINCH)
        except OSError:
            pass
        token = secrets.token_hex(8)
        # Ready once the exec TTY has our size (the CLI resizes it asynchronously; a resize arriving
        # while readline edits a command makes it redraw the line, and the echo no longer matches).
        init = (f"set +H; bind 'set enable-bracketed-paste off' 2>/dev/null; "
                f"export PROMPT_COMMAND='export PS1=\"{self.PS1}\"'; export PS2=\"\"; "
                f"for __i in $(seq 100); do [ \"$(stty size 2>/dev/null)\" = '{PTY_ROWS} {PTY_COLS}' ] && break; "
                f"sleep 0.05; done; unset __i; printf '%s %s\\n' \"__SAO_READY_\"'{token}' \"$$\"")
        self._write_pty(init.encode("utf-8") + ENTER)
        if not self._wait_ready(f"__SAO_READY_{token}", SHELL_START_TIMEOUT_S):
            with self.output_lock:
                tail = "".join(self.output_buffer)[-300:]
            rc = self.process.poll()
            self.close()
            self.target.check_running()  # gone: infrastructure; running: what the agent did to it
            last = tail.strip().splitlines()[-1:] or [""]  # the runtime's reason; before it, our init line
            raise SandboxBroken(
                f"no shell starts in the sandbox "
                f"({'docker exec exited with ' + str(rc) if rc is not None else 'no prompt'}): {last[0]!r}")
        self.clear_screen()

    def _read_output_continuously_pty(self) -> None:
        """The SDK's reader thread, with ``poll`` (``wait_fd``) for its ``select``; ends with the child, at EOF
        or once the PTY is closed."""
        fd = self._pty_master_fd
        while fd is not None and self._pty_master_fd == fd:
            if self.process is not None and self.process.poll() is not None:
                return
            try:
                if not wait_fd(fd, 0.1):
                    continue
                chunk = os.read(fd, 4096)
            except OSError as e:  # would block, or EIO as the child exits (as the SDK: go on); closed: done
                if e.errno == errno.EBADF:
                    return
                continue
            if not chunk:
                return
            with self.output_lock:
                self._add_text_to_buffer(chunk.decode("utf-8", errors="replace"))

    def _wait_for_pty_writable(self, timeout: float) -> bool:
        """The SDK's flow control (before each line of a multi-line command), with ``poll`` for ``select``."""
        return self._pty_master_fd is not None and wait_fd(self._pty_master_fd, timeout, write=True)

    def _wait_ready(self, marker: str, timeout: float) -> bool:
        """True once ``marker <shell pid>`` was printed and a prompt followed it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.output_lock:
                data = "".join(self.output_buffer)
            i = data.rfind(marker)
            if i >= 0 and self.PS1.strip().split("\n")[-1] in data[i:]:
                pid = data[i + len(marker):].split("\n", 1)[0].strip()
                self.shell_pid = int(pid) if pid.isdigit() else None
                return True
            if self.process is not None and self.process.poll() is not None:
                return False
            time.sleep(0.01)
        return False

    def _add_text_to_buffer(self, text: str) -> None:
        # The TTY sends CRLF. read_screen() drops CR anyway, but clear_screen() searches the raw buffer
        # for the PS1 block ("\n###PS1JSON###\n"), misses it, empties the buffer and sends an Enter for
        # a fresh prompt; the next command can then take that stray prompt for its own end and come back
        # with no output. Dropping CR as it arrives keeps the SDK's logic exact.
        text = text.replace("\r", "")
        if self._cutting:  # the rest of a cut line is dropped; its newline ends it
            nl = text.find("\n")
            if nl < 0:
                return
            self._cutting, text = False, text[nl + 1:]
            super()._add_text_to_buffer("\n")
        buf = self.output_buffer
        partial = len(buf[-1]) if buf and not buf[-1].endswith("\n") else 0
        segs = text.split("\n")
        long = next((k for k, seg in enumerate(segs) if len(seg) + (partial if k == 0 else 0) > MAX_LINE_CHARS), None)
        if long is None:
            super()._add_text_to_buffer(text)
            return
        keep = MAX_LINE_CHARS - (partial if long == 0 else 0)
        super()._add_text_to_buffer("".join(seg + "\n" for seg in segs[:long]) + segs[long][:max(keep, 0)]
                                    + LINE_CUT_MARKER.format(n=MAX_LINE_CHARS))
        self._cutting = True
        if long < len(segs) - 1:  # the cut line ended in this chunk: go on after its newline
            self._cutting = False
            super()._add_text_to_buffer("\n")
            self._add_text_to_buffer("\n".join(segs[long + 1:]))

    @property
    def closed(self) -> bool:
        """Closed, or the shell is gone (``exit`` typed, container stopped)."""
        return self._closed or (self.process is not None and self.process.poll() is not None)

    def interrupt(self) -> bool:
        """^C through the TTY (a signal to the local process group would kill the docker CLI)."""
        if not self._initialized or self.closed:
            return False
        try:
            self._write_pty(b"\x03")
            self._current_command_running = False
            return True
        except Exception:
            return False

    def close(self) -> None:
        if self._closed:
            return
        try:
            if self.process is not None and self.process.poll() is None and self.shell_pid:
                # like the SDK's reset of a host shell (it kills the process group): end every process
                # of the shell's session, so nothing the agent left running survives a reset
                self.target.kill_session(self.shell_pid)
            if self.process is not None and self.process.poll() is None:
                for data in (b"\x03", b"exit\n"):
                    try:
                        os.write(self._pty_master_fd, data)
                        time.sleep(0.05)
                    except OSError:
                        break
                try:
                    self.process.wait(timeout=1.0)
                except subprocess.TimeoutExpired:
                    try:
                        os.killpg(self.process.pid, signal.SIGKILL)
                    except OSError:
                        pass
                    self.process.wait(timeout=5)
        finally:
            if self._pty_master_fd is not None:
                try:
                    os.close(self._pty_master_fd)
                except OSError:
                    pass
            self._pty_master_fd = None
            if self.reader_thread is not None and self.reader_thread.is_alive():
                self.reader_thread.join(timeout=1)
            self.process = None
            self._closed = True


class SandboxTerminalExecutor(TerminalExecutor):
    """The SDK's ``TerminalExecutor`` whose every session (first, after reset, after exit) is in the container."""

    def __init__(self, target: SandboxTarget, no_change_timeout_seconds: int | None = None,
                 max_command_s: float = MAX_COMMAND_S):
        # super().__init__ is deliberately not called: it starts a shell on the host.
        self.target = target
        self.max_command_s = max_command_s
        self.shell_path = None
        self._working_dir = target.workdir
        self._username = None
        self._no_change_timeout_seconds = no_change_timeout_seconds
        self._terminal_type = "subprocess"
        self._env = None
        self._max_panes = 1
        self.full_output_save_dir = None
        self._pool = None
        self._sessions = {}
        self._sessions_lock = threading.Lock()
        self._pool_recovery_lock = threading.Lock()
        self.sessions_started = 0
        self.failure: SandboxUnavailable | None = None
        self._session = None
        try:
            self._session = self._new_session()
        except SandboxBroken as e:  # before the agent's first action nothing in the container is its doing
            raise SandboxUnavailable(f"container {target.container}: {e}") from e

    def _new_session(self) -> TerminalSession:
        session = TerminalSession(DockerExecTerminal(self.target), self._no_change_timeout_seconds)
        session.initialize()
        self.sessions_started += 1
        return session

    def _initialize_pool(self) -> None:
        raise RuntimeError("the sandbox terminal has no tmux pool (it would run on the host)")

    def _reset_single_session(self) -> TerminalObservation:
        """The SDK's reset, recreating the shell in the container (the SDK's own would start a host shell)."""
        if self._session is not None:
            self._session.close()
        self._session = self._new_session()
        return TerminalObservation.from_text(text=self._RESET_TEXT, command="[RESET]", exit_code=0)

    def __call__(self, action, conversation=None) -> TerminalObservation:
        done, stopped = threading.Event(), threading.Event()
        watchdog = threading.Timer(self.max_command_s, self._stop_overdue, (done, stopped))
        watchdog.daemon = True
        try:
            s = self._session
            if s is not None and not s._closed and s.terminal.closed:
                s.close()  # the shell exited: the SDK resets a closed session before running the command
            watchdog.start()
            obs = super().__call__(action, conversation)
            done.set()
            if self._session is not None and self._session.terminal.closed:
                self.target.check_running()  # the shell died with its container: not the agent's doing
            return self._noted(obs, STOPPED_NOTE.format(s=self.max_command_s)) if stopped.is_set() else obs
        except SandboxUnavailable as e:
            self.failure = e
            raise
        finally:
            done.set()
            watchdog.cancel()

    def _stop_overdue(self, done: threading.Event, stopped: threading.Event) -> None:
        """The call is past ``max_command_s``: ^C through the TTY, then SIGKILL the shell's session."""
        session = self._session
        if done.is_set() or session is None or session.terminal.closed:
            return
        stopped.set()
        try:
            session.terminal._write_pty(b"\x03")
        except OSError:
            pass
        if not done.wait(KILL_GRACE_S) and session.terminal.shell_pid is not None:
            self.target.kill_session(session.terminal.shell_pid)  # the shell exits: the SDK sees it closed

    @staticmethod
    def _noted(obs: TerminalObservation, note: str) -> TerminalObservation:
        *head, last = obs.content
        return obs.model_copy(update={"content": [*head, last.model_copy(update={"text": last.text + note})]})
