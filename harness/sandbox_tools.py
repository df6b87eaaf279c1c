"""The OpenHands SDK's own ``terminal`` and ``file_editor`` tools, executing inside a Docker sandbox.

Contract:
- ``SandboxTarget(container, workdir="/testbed", ...)`` names a running container (id or name) and
  how to reach it (``DOCKER_HOST`` from the environment unless given).
- ``SandboxTools(target)`` holds one episode's executors and registers them under ``.key``;
  ``.tool_specs()`` are the ``openhands.sdk.Tool`` specs an ``Agent`` takes (they resolve to the
  SDK's ``TerminalTool`` / ``FileEditorTool`` definitions: same names, schemas, descriptions and
  observation texts); ``.close()`` ends the shell and removes the host scratch directories.
- Terminal: the SDK's PTY terminal (``SubprocessTerminal``) whose child is
  ``docker exec -it -w <workdir> <container> bash -i``; the SDK's session logic (PS1 protocol,
  timeouts, ``is_input``, ``reset``) is unchanged. Every shell the executor ever starts, including
  after ``reset=true`` or an ``exit`` typed by the agent, is a shell in the container: no code path
  of the executor can start a host shell.
- File editor: the SDK's unmodified ``FileEditor`` runs on a per-call host *shadow* of exactly the
  container paths a command reads (fetched with one ``docker exec`` probe); what it writes is copied
  back with ``put_archive``; host paths are mapped back in every text the model sees. All container
  access goes through the Docker API, the agent's files exist in the container only.
- A container that vanishes or a Docker failure raises ``SandboxUnavailable`` from the executor and
  is kept in ``SandboxTools.failure``: the SDK turns any tool exception into an error the agent sees
  and goes on, so the caller must end the episode itself (``harness.agent`` does, before the next LLM
  request) and count it as an infrastructure failure.
"""
from __future__ import annotations

import fcntl
import io
import os
import pty
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import tarfile
import tempfile
import termios
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before litellm is imported (via the SDK)
os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")

from openhands.sdk.tool import Tool, register_tool  # noqa: E402
from openhands.tools.file_editor import FileEditorTool  # noqa: E402
from openhands.tools.file_editor.definition import FileEditorAction, FileEditorObservation  # noqa: E402
from openhands.tools.file_editor.exceptions import EditorToolParameterInvalidError  # noqa: E402
from openhands.tools.file_editor.impl import FileEditorExecutor  # noqa: E402
from openhands.tools.terminal import TerminalTool  # noqa: E402
from openhands.tools.terminal.definition import TerminalObservation  # noqa: E402
from openhands.tools.terminal.impl import TerminalExecutor  # noqa: E402
from openhands.tools.terminal.terminal.subprocess_terminal import ENTER, SubprocessTerminal  # noqa: E402
from openhands.tools.terminal.terminal.terminal_session import TerminalSession  # noqa: E402

PTY_ROWS, PTY_COLS = 100, 4000
SHELL_START_TIMEOUT_S = 30.0
# The docker CLI detaches on its detach keys (default ctrl-p,ctrl-q); make that sequence unlikely.
DETACH_KEYS = "ctrl-@,ctrl-@"
# Host environment the docker CLI needs (nothing else of the host reaches the container).
_CLI_ENV_KEYS = ("PATH", "HOME", "DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CERT_PATH", "DOCKER_TLS_VERIFY",
                 "DOCKER_CONTEXT", "DOCKER_API_VERSION")
_SHELL_ENV = {"TERM": "xterm-256color", "PAGER": "cat", "GIT_PAGER": "cat", "PS2": ""}


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot be reached (container gone, Docker error): an infrastructure failure."""


@dataclass
class SandboxTarget:
    """A running container the tools act in."""

    container: str  # id or name
    workdir: str = "/testbed"
    user: str | None = None  # exec user; None = the image's
    env: dict[str, str] = field(default_factory=dict)  # extra environment of the agent's shell
    docker_host: str | None = None  # None = $DOCKER_HOST (set by envs.engine.ensure_engine)
    client: Any = None  # docker.DockerClient; None = one made for docker_host
    docker_bin: str | None = None  # None = `docker` on PATH

    def __post_init__(self):
        if not self.workdir.startswith("/"):
            raise ValueError(f"sandbox workdir must be absolute: {self.workdir!r}")
        self.docker_host = self.docker_host or os.environ.get("DOCKER_HOST")

    @classmethod
    def from_sandbox(cls, sb) -> "SandboxTarget":
        """The target of an ``envs.sandbox.Sandbox`` (its container already carries its environment)."""
        return cls(container=sb.container_id, workdir=sb.workdir, user=sb.cfg.user,
                   docker_host=sb.docker_host, client=sb.client)

    def docker(self):
        if self.client is None:
            import docker

            self.client = (docker.DockerClient(base_url=self.docker_host, timeout=120) if self.docker_host
                           else docker.from_env(timeout=120))
        return self.client

    def check_running(self) -> None:
        """``SandboxUnavailable`` unless the container is running."""
        import docker

        try:
            state = self.docker().api.inspect_container(self.container)["State"]
        except docker.errors.NotFound:
            raise SandboxUnavailable(f"container {self.container} was removed") from None
        except docker.errors.DockerException as e:
            raise SandboxUnavailable(f"cannot inspect container {self.container}: {e}") from e
        if not state.get("Running"):
            raise SandboxUnavailable(f"container {self.container} is not running ({state.get('Status')}, "
                                     f"exit code {state.get('ExitCode')}, oom killed: {state.get('OOMKilled')})")

    def kill_session(self, sid: int) -> None:
        """SIGKILL every process of session ``sid`` in the container (bash builtins only); best effort."""
        script = ('sid=$1; for p in /proc/[0-9]*; do read -r s < "$p/stat" 2>/dev/null || continue; '
                  'set -- ${s##*) }; [ "$4" = "$sid" ] && kill -9 "${p#/proc/}" 2>/dev/null; done; true')
        try:
            api = self.docker().api
            ex = api.exec_create(self.container, ["bash", "-c", script, "kill", str(sid)], user=self.user or "")
            api.exec_start(ex["Id"])
        except Exception:
            pass

    def cli(self) -> str:
        path = self.docker_bin or shutil.which("docker")
        if not path:
            raise SandboxUnavailable("the docker CLI is not on PATH (the sandbox terminal runs `docker exec -it`)")
        return path

    def cli_env(self) -> dict[str, str]:
        env = {k: os.environ[k] for k in _CLI_ENV_KEYS if k in os.environ}
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        if self.docker_host:
            env["DOCKER_HOST"] = self.docker_host
        return env


# ---------------------------------------------------------------------------------------- terminal

class DockerExecTerminal(SubprocessTerminal):
    """The SDK's PTY terminal with ``docker exec -it ... bash -i`` as its child (never a host shell)."""

    def __init__(self, target: SandboxTarget):
        super().__init__(target.workdir, username=None, shell_path=None, env=None)
        self.target = target
        self.shell_pid: int | None = None  # in the container's pid namespace; the shell leads its session

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
            self.target.check_running()  # a clearer reason when the container is gone
            raise SandboxUnavailable(
                f"shell in container {self.target.container} did not start "
                f"({'docker exec exited with ' + str(rc) if rc is not None else 'no prompt'}): {tail.strip()!r}")
        self.clear_screen()

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
        super()._add_text_to_buffer(text.replace("\r", ""))

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

    def __init__(self, target: SandboxTarget, no_change_timeout_seconds: int | None = None):
        # super().__init__ is deliberately not called: it starts a shell on the host.
        self.target = target
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
        self._session = self._new_session()

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
        try:
            s = self._session
            if s is not None and not s._closed and s.terminal.closed:
                s.close()  # the shell exited: the SDK resets a closed session before running the command
            obs = super().__call__(action, conversation)
            if self._session is not None and self._session.terminal.closed:
                self.target.check_running()  # the shell died with its container: not the agent's doing
            return obs
        except SandboxUnavailable as e:
            self.failure = e
            raise


# ------------------------------------------------------------------------------------- file editor

# One round trip: the container user, the type of each probed path, a directory listing (children and
# non-hidden grandchildren, following symlinks like Path.is_dir/iterdir), and a regular file's bytes.
_PROBE = r'''
set -u
max=$1; list=$2; fetch=$3; shift 3
printf 'U\0%s\0%s\0' "$(id -u)" "$(id -g)"
for p in "$@"; do
  if [ -d "$p" ]; then t=d; elif [ -f "$p" ]; then t=f; elif [ -e "$p" ]; then t=o; else t=n; fi
  s=$( [ "$t" = n ] && echo "0 0 0 0" || stat -L -c '%s %f %u %g' -- "$p" 2>/dev/null || echo "0 0 0 0")
  printf 'T\0%s\0%s\0' "$t" "$s"
done
if [ "$list" != - ] && [ -d "$list" ]; then
  shopt -s nullglob dotglob
  for c in "$list"/*; do
    n=${c##*/}
    if [ -d "$c" ]; then printf 'd\0%s\0' "$n"; else printf 'f\0%s\0' "$n"; fi
    case "$n" in .*) continue ;; esac
    if [ -d "$c" ] && [ -r "$c" ] && [ -x "$c" ]; then
      for g in "$c"/*; do
        m=${g##*/}
        case "$m" in .*) continue ;; esac
        if [ -d "$g" ]; then printf 'd\0%s/%s\0' "$n" "$m"; else printf 'f\0%s/%s\0' "$n" "$m"; fi
      done
    fi
  done
fi
printf 'E\0'
if [ "$fetch" != - ] && [ -f "$fetch" ] && [ -r "$fetch" ] && [ "$(stat -L -c %s -- "$fetch")" -le "$max" ]; then
  printf 'C\0'
  exec timeout -s KILL 60 cat -- "$fetch"
fi
printf 'N\0'
'''


@dataclass
class _Stat:
    kind: str  # d (dir), f (regular file), o (other), n (missing)
    size: int = 0
    mode: int = 0o644
    uid: int = 0
    gid: int = 0


@dataclass
class _Probe:
    uid: int
    gid: int
    stats: list[_Stat]
    entries: list[tuple[str, str]]  # (kind, path relative to the listed dir)
    content: bytes | None


def _parse_probe(out: bytes, n_paths: int) -> _Probe:
    pos = 0

    def field_() -> str:
        nonlocal pos
        end = out.index(b"\0", pos)
        value = out[pos:end].decode("utf-8", "surrogateescape")
        pos = end + 1
        return value

    if field_() != "U":
        raise ValueError("bad probe header")
    uid, gid = int(field_()), int(field_())
    stats = []
    for _ in range(n_paths):
        if field_() != "T":
            raise ValueError("bad probe stat")
        kind = field_()
        size, mode_hex, suid, sgid = (field_().split() + ["0"] * 4)[:4]
        stats.append(_Stat(kind, int(size), int(mode_hex, 16) & 0o7777 if mode_hex != "0" else 0o644,
                           int(suid), int(sgid)))
    entries = []
    while True:
        kind = field_()
        if kind == "E":
            break
        entries.append((kind, field_()))
    content = out[pos:] if field_() == "C" else None
    return _Probe(uid, gid, stats, entries, content)


class SandboxFileEditorExecutor(FileEditorExecutor):
    """The SDK's ``FileEditorExecutor`` (unmodified ``FileEditor`` logic) acting on the container's files.

    Each call rebuilds a host shadow directory with what the command can read (the target file's
    bytes, its parent, or a directory's two-level listing as empty stubs), runs the SDK editor on the
    shadow path, uploads a changed file with ``put_archive`` and maps shadow paths back to container
    paths in the observation. The editor's undo history lives on the host, keyed by path.
    """

    def __init__(self, target: SandboxTarget):
        self.target = target
        self.shadow = tempfile.mkdtemp(prefix="sao-fe-")
        super().__init__(workspace_root=self.shadow + target.workdir)
        self.calls = 0
        self.failure: SandboxUnavailable | None = None
        self._lock = threading.Lock()

    # -- container I/O
    def _exec(self, argv: list[str]) -> tuple[str, bytes, bytes]:
        import docker

        api = self.target.docker().api
        try:
            ex = api.exec_create(self.target.container, argv, stdout=True, stderr=True,
                                 user=self.target.user or "", workdir="/")
            out, err = api.exec_start(ex["Id"], demux=True)
        except docker.errors.DockerException as e:
            raise SandboxUnavailable(f"docker exec in {self.target.container} failed: {e}") from e
        return ex["Id"], out or b"", err or b""

    def _probe(self, paths: list[str], list_dir: str | None, fetch: str | None) -> _Probe:
        max_bytes = self.editor._max_file_size
        argv = ["bash", "-c", _PROBE, "probe", str(max_bytes), list_dir or "-", fetch or "-", *paths]
        exec_id, out, err = self._exec(argv)
        try:
            return _parse_probe(out, len(paths))
        except (ValueError, IndexError) as e:
            self.target.check_running()
            try:
                rc = self.target.docker().api.exec_inspect(exec_id).get("ExitCode")
            except Exception:
                rc = None
            raise SandboxUnavailable(f"file probe in {self.target.container} failed (exit {rc}): "
                                     f"{err.decode(errors='replace')[-300:]!r}") from e

    def _upload(self, cpath: str, data: bytes, mode: int, uid: int, gid: int) -> str | None:
        """Write ``data`` to ``cpath`` in the container; None, or the error the write ran into.

        ``put_archive`` first (keeps owner and mode); where the archive API cannot write (a tmpfs, a
        read-only root) ``cat`` in the container does, as the container user, and its error is the agent's.
        """
        import docker

        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            info = tarfile.TarInfo(os.path.basename(cpath))
            info.size, info.mode, info.uid, info.gid, info.mtime = len(data), mode, uid, gid, time.time()
            tar.addfile(info, io.BytesIO(data))
        try:
            if self.target.docker().api.put_archive(self.target.container, os.path.dirname(cpath) or "/",
                                                    buf.getvalue()):
                return None
        except docker.errors.DockerException:
            pass
        self.target.check_running()
        return self._write_via_exec(cpath, data, mode)

    def _write_via_exec(self, cpath: str, data: bytes, mode: int) -> str | None:
        import docker

        api = self.target.docker().api
        script = 'cat > "$1" && chmod "$2" "$1"'
        try:
            ex = api.exec_create(self.target.container, ["sh", "-c", script, "write", cpath, oct(mode)[2:]],
                                 stdin=True, stdout=True, stderr=True, user=self.target.user or "", workdir="/")
            raw = api.exec_start(ex["Id"], socket=True)
            sock = getattr(raw, "_sock", raw)
            try:
                sock.sendall(data)
                sock.shutdown(socket.SHUT_WR)
                out = b""
                while chunk := sock.recv(1 << 16):
                    out += chunk
            finally:
                sock.close()
            rc = api.exec_inspect(ex["Id"]).get("ExitCode")
        except (docker.errors.DockerException, OSError) as e:
            self.target.check_running()
            raise SandboxUnavailable(f"writing {cpath} in {self.target.container} failed: {e}") from e
        if rc == 0:
            return None
        text, pos = b"", 0  # the exec stream's frames: 8-byte header (stream, size), then the payload
        while pos + 8 <= len(out):
            size = struct.unpack(">I", out[pos + 4:pos + 8])[0]
            text += out[pos + 8:pos + 8 + size]
            pos += 8 + size
        return text.decode("utf-8", "replace").strip().removeprefix("write: ") or f"exit code {rc}"

    # -- shadow
    def _reset_shadow(self) -> None:
        for child in os.listdir(self.shadow):
            p = os.path.join(self.shadow, child)
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p)
            else:
                os.unlink(p)

    def _host(self, cpath: str) -> str:
        return self.shadow + ("" if cpath == "/" else cpath)

    def _stub(self, cpath: str, st: _Stat) -> None:
        host = self._host(cpath)
        if st.kind == "d":
            os.makedirs(host, exist_ok=True)
        elif st.kind in ("f", "o"):
            os.makedirs(os.path.dirname(host), exist_ok=True)
            if not os.path.exists(host):
                with open(host, "wb") as f:
                    f.truncate(st.size if st.kind == "f" else 0)

    def _unmap(self, text: str, shadow_path: str, shown: str) -> str:
        return text.replace(shadow_path, shown).replace(self.shadow, "")

    def __call__(self, action: FileEditorAction, conversation=None) -> FileEditorObservation:
        self.calls += 1
        try:
            with self._lock:  # one shadow directory: one call at a time
                return self._call(action, conversation)
        except SandboxUnavailable as e:
            self.failure = e
            raise

    def _call(self, action: FileEditorAction, conversation=None) -> FileEditorObservation:
        path = action.path
        if "\0" in path:
            return super().__call__(action.model_copy(update={"path": self.shadow + "/" + path}), conversation)
        if not path.startswith("/"):
            return self._relative(action)
        cpath = os.path.normpath(path)
        if cpath.startswith("//"):
            cpath = "/" + cpath.lstrip("/")
        parent = os.path.dirname(cpath)
        is_view = action.command == "view"
        fetch = action.command != "create"
        probe = self._probe([cpath, parent], list_dir=cpath if is_view else None, fetch=cpath if fetch else None)
        target, pstat = probe.stats
        self._reset_shadow()
        if pstat.kind != "n":
            self._stub(parent, pstat)
        self._stub(cpath, target)
        if target.kind == "d":
            for kind, rel in probe.entries:
                self._stub(cpath.rstrip("/") + "/" + rel, _Stat("d" if kind == "d" else "o"))
        host = self._host(cpath)
        if fetch and target.kind == "f" and probe.content is None and target.size <= self.editor._max_file_size:
            shown = str(Path(path))  # not readable by the container user: the error the SDK editor gives
            return FileEditorObservation.from_text(
                text=f"Ran into [Errno 13] Permission denied: '{shown}' while trying to read {shown}",
                command=action.command, is_error=True)
        if target.kind == "f" and probe.content is not None:
            with open(host, "wb") as f:
                f.write(probe.content)
            os.chmod(host, target.mode)
        before = probe.content if target.kind == "f" else None
        obs = super().__call__(action.model_copy(update={"path": host}), conversation)
        if action.command != "view" and not obs.is_error and os.path.isfile(host) and not os.path.islink(host):
            with open(host, "rb") as f:
                data = f.read()
            mode = os.stat(host).st_mode & 0o7777
            if data != before or target.kind != "f" or mode != target.mode:
                uid, gid = (target.uid, target.gid) if target.kind == "f" else (probe.uid, probe.gid)
                failed = self._upload(cpath, data, mode, uid, gid)
                if failed is not None:  # as the SDK editor reports a failed write (the edit did not happen)
                    shown = str(Path(path))
                    return FileEditorObservation.from_text(
                        text=f"Ran into {failed} while trying to write to {shown}", command=action.command,
                        is_error=True)
        shown = str(Path(path))
        text = self._unmap(obs.text, host, shown)
        update: dict[str, Any] = {"path": shown if obs.path is not None else None}
        if text != obs.text:
            update["content"] = [c.model_copy(update={"text": self._unmap(c.text, host, shown)})
                                 if hasattr(c, "text") else c for c in obs.content]
        return obs.model_copy(update=update)

    def _relative(self, action: FileEditorAction) -> FileEditorObservation:
        """The SDK editor's relative-path error, with its existence check done in the container."""
        hint = "The path should be an absolute path."
        suggested = os.path.join(self.target.workdir, action.path)
        if self._probe([os.path.normpath(suggested)], None, None).stats[0].kind != "n":
            hint += f" Maybe you meant {Path(suggested)}?"
        err = EditorToolParameterInvalidError("path", str(Path(action.path)), hint)
        return FileEditorObservation.from_text(text=err.message, command=action.command, is_error=True)

    def close(self) -> None:
        shutil.rmtree(self.shadow, ignore_errors=True)
        hist = getattr(self.editor._history_manager.cache, "directory", None)
        if hist is not None:
            shutil.rmtree(hist, ignore_errors=True)


# ------------------------------------------------------------------------------------- tool specs

_BINDINGS: dict[str, "SandboxTools"] = {}
_BINDINGS_LOCK = threading.Lock()


def _binding(key: str) -> "SandboxTools":
    with _BINDINGS_LOCK:
        b = _BINDINGS.get(key)
    if b is None:
        raise KeyError(f"no live sandbox tools under key {key!r} (closed already?)")
    return b


class SandboxTerminalFactory(TerminalTool):
    """Resolves to the SDK's ``TerminalTool`` with this episode's in-container executor."""

    name: ClassVar[str] = "sandbox_terminal_factory"
    user_selectable: ClassVar[bool] = False

    @classmethod
    def create(cls, conv_state, sandbox: str, **_: Any) -> Sequence[TerminalTool]:
        return TerminalTool.create(conv_state, executor=_binding(sandbox).terminal)


class SandboxFileEditorFactory(FileEditorTool):
    """Resolves to the SDK's ``FileEditorTool`` (description naming the container workdir) with this
    episode's in-container executor."""

    name: ClassVar[str] = "sandbox_file_editor_factory"
    user_selectable: ClassVar[bool] = False

    @classmethod
    def create(cls, conv_state, sandbox: str, **_: Any) -> Sequence[FileEditorTool]:
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
        return out


TERMINAL_SPEC_NAME = "SaoSandboxTerminal"
FILE_EDITOR_SPEC_NAME = "SaoSandboxFileEditor"
register_tool(TERMINAL_SPEC_NAME, SandboxTerminalFactory)
register_tool(FILE_EDITOR_SPEC_NAME, SandboxFileEditorFactory)


class SandboxTools:
    """One episode's in-container terminal and file editor, registered for tool resolution."""

    def __init__(self, target: SandboxTarget, no_change_timeout_seconds: int | None = None):
        self.target = target
        self.key = uuid.uuid4().hex
        self.terminal = SandboxTerminalExecutor(target, no_change_timeout_seconds)
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

    def tool_specs(self) -> list[Tool]:
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

    def __enter__(self) -> "SandboxTools":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
