"""A persistent bash inside a container, driven over a Docker exec stdin socket.

Contract:
- ``PersistentShell(api, container_id, ...)`` starts one long-lived ``bash`` (stdin socket, stderr
  merged into stdout) plus a second, idle "control" bash in its own exec. Both run in their own
  session (every ``docker exec`` is a session leader); commands get their own process groups
  (``set -m``).
- ``run(command, timeout_s)`` sends the command (ANSI-C quoted, ``eval``'d with stdin from
  /dev/null), reads until a per-command random sentinel line ``<token> <exit code> <cwd>`` and
  returns ``ShellResult``. cwd, variables and functions persist across commands.
- Output over ``cap_chars`` keeps the head and tail with a marker saying how much was cut; bytes
  are decoded with ``errors="replace"``. Memory stays bounded whatever a command prints.
- On timeout the control shell kills every process in the main shell's session except the shell
  (bash builtins only: no fork, so this works even when a fork bomb exhausted the pids limit), and
  ``CommandTimeout`` (with the partial output) is raised; if the shell itself is stuck (a builtin
  loop) it is replaced by a new one in the last known cwd. The shell stays usable.
- When the stream ends (the shell exited, or the container died) ``ShellExited`` tells the caller,
  which decides between restarting and a typed container fault.
"""
from __future__ import annotations

import secrets
import select
import struct
import time
from dataclasses import dataclass

# Bash definitions of the control shell. Only builtins: it must work when no process can be forked.
_CONTROL_INIT = r"""
exec 2>&1
__sao_kill() {
  local sid=$1 keep=$2 tok=$3 r p s rest pid found total=0
  for r in {1..200}; do
    found=0
    for p in /proc/[0-9]*; do
      read -r s < "$p/stat" 2>/dev/null || continue
      rest=${s##*) }
      set -- $rest
      pid=${p#/proc/}
      if [ "$4" = "$sid" ] && [ "$pid" != "$keep" ] && [ "$1" != Z ] && [ "$1" != X ]; then
        kill -9 "$pid" 2>/dev/null && found=$((found + 1))
      fi
    done
    total=$((total + found))
    [ "$found" = 0 ] && break
  done
  printf '%s %d\n' "$tok" "$total"
}
__sao_count() {
  local sid=$1 tok=$2 p s rest n=0
  for p in /proc/[0-9]*; do
    read -r s < "$p/stat" 2>/dev/null || continue
    rest=${s##*) }
    set -- $rest
    [ "$4" = "$sid" ] && [ "$1" != Z ] && n=$((n + 1))
  done
  printf '%s %d\n' "$tok" "$n"
}
__sao_oom() {
  local tok=$1 f k v n=-1
  for f in /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events; do
    if [ -r "$f" ]; then
      while read -r k v; do [ "$k" = oom_kill ] && n=$v; done < "$f"
      break
    fi
  done
  printf '%s %s\n' "$tok" "$n"
}
"""

_MAIN_INIT = "exec 2>&1; set -m; unset HISTFILE PROMPT_COMMAND; PS1=; PS2=\n"

_HEADER = struct.Struct(">BxxxL")


class ShellExited(Exception):
    """The shell's stream ended (the shell exited or its container died)."""

    def __init__(self, output: str, exit_code: int | None):
        super().__init__("shell stream ended")
        self.output = output
        self.exit_code = exit_code


class ShellTimeout(Exception):
    """Internal: the deadline passed (carries what was read so far)."""

    def __init__(self, collector: _Collector):
        super().__init__("deadline passed")
        self.collector = collector


@dataclass
class ShellResult:
    output: str
    exit_code: int
    duration_s: float
    cut_bytes: int = 0  # bytes of output not shown (0 = complete)
    cwd: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def ansi_c_quote(text: str) -> str:
    """``$'...'`` literal of ``text`` (any bytes, newlines included) for bash."""
    out = []
    for b in text.encode("utf-8", errors="surrogateescape"):
        if 0x20 <= b < 0x7F and b not in (0x27, 0x5C):
            out.append(chr(b))
        else:
            out.append(f"\\x{b:02x}")
    return "$'" + "".join(out) + "'"


def wait_fd(fd, timeout_s: float, *, write: bool = False) -> bool:
    """True once ``fd`` (a descriptor, or an object with ``fileno()``) can be read (``write``: written) or hung
    up, False after ``timeout_s``. ``poll``, not ``select``: select refuses a descriptor >= 1024 (FD_SETSIZE),
    and a process running a hundred episodes at once holds a few thousand."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT if write else select.POLLIN | select.POLLPRI)
    return bool(poller.poll(max(0.0, timeout_s) * 1000))


class _Stream:
    """Demultiplexes Docker's framed exec stream (8-byte headers) from a raw socket."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = bytearray()
        self.left = 0  # payload bytes left in the current frame
        self.eof = False

    def _recv(self, deadline: float | None) -> bool:
        if self.eof:
            return False
        pending = getattr(self.sock, "pending", None)  # TLS: bytes decrypted but invisible to select
        if deadline is not None and not (pending and pending()):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            if not wait_fd(self.sock, remaining):
                raise TimeoutError
        try:
            data = self.sock.recv(1 << 16)
        except (ConnectionError, OSError):
            data = b""
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def read(self, deadline: float | None) -> bytes | None:
        """Next payload bytes (stdout or stderr), None at end of stream; TimeoutError at the deadline."""
        while True:
            if self.left == 0:
                while len(self.buf) < _HEADER.size:
                    if not self._recv(deadline):
                        return None
                _, self.left = _HEADER.unpack_from(self.buf)
                del self.buf[:_HEADER.size]
                continue
            if not self.buf and not self._recv(deadline):
                return None
            n = min(self.left, len(self.buf))
            chunk = bytes(self.buf[:n])
            del self.buf[:n]
            self.left -= n
            if chunk:
                return chunk


class _Collector:
    """Bounded capture of one command's output up to its sentinel line."""

    def __init__(self, token: bytes, keep: int):
        self.marker = b"\n" + token + b" "
        self.keep = keep  # bytes kept at each end
        self.head = bytearray()
        self.tail = bytearray()
        self.tail_start = 0  # absolute offset of tail[0]
        self.total = 0
        self.search_from = 0  # absolute offset
        self.found: int | None = None  # absolute offset of the marker
        self.line: bytes | None = None  # sentinel line (without the marker)

    def feed(self, chunk: bytes) -> bool:
        """Add bytes; True once the sentinel line is complete."""
        if len(self.head) < self.keep:
            self.head += chunk[: self.keep - len(self.head)]
        self.tail += chunk
        self.total += len(chunk)
        if self.found is None:
            rel = self.tail.find(self.marker, max(0, self.search_from - self.tail_start))
            if rel < 0:
                self.search_from = max(self.tail_start, self.total - len(self.marker))
                self._trim()
                return False
            self.found = self.tail_start + rel
        start = self.found - self.tail_start + len(self.marker)
        end = self.tail.find(b"\n", start)
        if end < 0:
            return False
        self.line = bytes(self.tail[start:end])
        return True

    def _trim(self) -> None:
        limit = 2 * self.keep + len(self.marker) + 64
        if len(self.tail) > 2 * limit:
            cut = len(self.tail) - limit
            del self.tail[:cut]
            self.tail_start += cut

    def output(self, cap_chars: int, end: int | None = None) -> tuple[str, int]:
        """(text, bytes cut) of the output before the sentinel (or everything read so far)."""
        if end is None:
            end = self.found if self.found is not None else self.total
        if self.tail_start == 0:  # everything is still here: cut exactly, in characters
            text = bytes(self.tail[:end]).decode("utf-8", errors="replace")
            if len(text) <= cap_chars:
                return text, 0
            half = cap_chars // 2
            head, tail = text[:half], text[len(text) - (cap_chars - half):]
            cut = len(text) - len(head) - len(tail)
            cut_b = end - len(head.encode("utf-8", "replace")) - len(tail.encode("utf-8", "replace"))
            return f"{head}\n[... {cut:,} characters of output cut ...]\n{tail}", max(cut_b, 0)
        half = cap_chars // 2
        head = bytes(self.head[: min(len(self.head), end)]).decode("utf-8", errors="replace")[:half]
        rel_end = end - self.tail_start
        tail_b = bytes(self.tail[max(0, rel_end - self.keep): rel_end])
        tail = tail_b.decode("utf-8", errors="replace")
        tail = tail[len(tail) - (cap_chars - half):] if len(tail) > cap_chars - half else tail
        cut = end - len(head.encode("utf-8", "replace")) - len(tail.encode("utf-8", "replace"))
        return f"{head}\n[... {max(cut, 0):,} bytes of output cut ...]\n{tail}", max(cut, 0)


class _Exec:
    """One bash in an exec with a stdin socket."""

    def __init__(self, api, container_id: str, *, user, workdir, env, init: str):
        self.api = api
        self.exec_id = api.exec_create(container_id, ["bash", "--noprofile", "--norc"], stdin=True, stdout=True,
                                       stderr=True, tty=False, environment=env or None, workdir=workdir,
                                       user=user or "")["Id"]
        raw = api.exec_start(self.exec_id, socket=True)
        self._raw = raw  # keeps the HTTP response (and so the connection) alive
        self.sock = getattr(raw, "_sock", raw)
        self.sock.setblocking(True)
        self.stream = _Stream(self.sock)
        self.send(init)

    def send(self, text: str) -> None:
        try:
            self.sock.sendall(text.encode("utf-8", errors="surrogateescape"))
        except OSError:
            pass  # the stream's end is noticed (and reported) by the reader

    def exit_code(self, wait_s: float = 1.0) -> int | None:
        """The exec's exit code once it has ended (None if unknown within ``wait_s``)."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                info = self.api.exec_inspect(self.exec_id)
            except Exception:
                return None
            if not info.get("Running") or time.monotonic() >= deadline:
                return info.get("ExitCode")
            time.sleep(0.02)

    def close(self) -> None:
        for obj in (self.sock, self._raw):
            try:
                obj.close()
            except Exception:
                pass


class PersistentShell:
    """See the module doc. Not thread-safe: one command at a time per shell."""

    def __init__(self, api, container_id: str, *, user: str | None = None, workdir: str | None = None,
                 env: dict[str, str] | None = None, cap_chars: int = 30_000, ready_timeout_s: float = 30.0):
        self.api = api
        self.container_id = container_id
        self.user = user
        self.env = dict(env or {})
        self.cap_chars = cap_chars
        self.cwd = workdir
        self.ready_timeout_s = ready_timeout_s
        self.control = _Exec(api, container_id, user=user, workdir=None, env=None, init=_CONTROL_INIT)
        self.main: _Exec | None = None
        self.pid = 0
        self.sid = 0
        self.oom_count = self.oom_kills()
        self._start_main()

    # -- main shell -------------------------------------------------------------------------------
    def _start_main(self) -> None:
        self.main = _Exec(self.api, self.container_id, user=self.user, workdir=self.cwd, env=self.env,
                          init=_MAIN_INIT)
        res = self._roundtrip('read -r __sao_stat < /proc/$$/stat; __sao_r=${__sao_stat##*) }; '
                              'set -- $__sao_r; printf "%s %s\\n" "$$" "$4"; unset __sao_stat __sao_r; set --',
                              self.ready_timeout_s)
        try:
            pid, sid = res.output.split()[-2:]
            self.pid, self.sid = int(pid), int(sid)
        except ValueError:
            raise ShellExited(res.output, None) from None

    def restart(self) -> None:
        """Replace the main shell (after it exited or got stuck), in the last known cwd."""
        if self.main is not None:
            self.kill_session(include_shell=True)
            self.main.close()
        self._start_main()

    def _roundtrip(self, command: str, timeout_s: float, cap_chars: int | None = None) -> ShellResult:
        assert self.main is not None
        t0 = time.monotonic()
        token = "__SAO_" + secrets.token_hex(8)
        cap = cap_chars or self.cap_chars
        col = _Collector(token.encode(), keep=2 * cap + 16)
        self.main.send(f"eval {ansi_c_quote(command)} </dev/null; "
                       f"printf '\\n%s %d %s\\n' {token} $? \"$PWD\"\n")
        deadline = t0 + timeout_s
        while True:
            try:
                chunk = self.main.stream.read(deadline)
            except TimeoutError:
                raise ShellTimeout(col) from None
            if chunk is None:
                text, _ = col.output(cap)
                raise ShellExited(text, self.main.exit_code())
            if col.feed(chunk):
                break
        rc_s, _, cwd = col.line.decode("utf-8", errors="replace").partition(" ")
        self.cwd = cwd or self.cwd
        text, cut = col.output(cap)
        return ShellResult(text, int(rc_s), time.monotonic() - t0, cut, self.cwd)

    def run(self, command: str, timeout_s: float, cap_chars: int | None = None) -> ShellResult:
        """Run ``command``; ``ShellTimeout`` (after killing its processes) or ``ShellExited`` on faults."""
        try:
            return self._roundtrip(command, timeout_s, cap_chars)
        except ShellTimeout as t:
            col = t.collector
            for _ in range(3):  # kill; the shell prints its sentinel once the command list ends
                self.kill_session()
                grace = time.monotonic() + 1.0
                try:
                    while col.line is None:
                        chunk = self.main.stream.read(grace)
                        if chunk is None or col.feed(chunk):
                            break
                except TimeoutError:
                    pass
                if col.line is not None or self.main.stream.eof:
                    break
            if col.line is None and not self.main.stream.eof:  # stuck in a builtin loop: replace it
                try:
                    self.restart()
                except Exception:  # a dead container: the caller inspects it; the next run sees EOF
                    pass
            raise

    # -- control shell ----------------------------------------------------------------------------
    def _control(self, call: str, timeout_s: float = 30.0) -> str:
        token = "__SAO_" + secrets.token_hex(8)
        self.control.send(f"{call} {token}\n")
        col = _Collector(token.encode(), keep=4096)
        col.marker = token.encode() + b" "
        deadline = time.monotonic() + timeout_s
        while True:
            chunk = self.control.stream.read(deadline)
            if chunk is None:
                raise ShellExited("", self.control.exit_code())
            if col.feed(chunk):
                return col.line.decode(errors="replace")

    def kill_session(self, include_shell: bool = False) -> int:
        """Kill every process the main shell started (its session); returns how many were killed."""
        keep = 0 if include_shell else self.pid
        try:
            return int(self._control(f"__sao_kill {self.sid} {keep}"))
        except (ShellExited, TimeoutError, ValueError):
            return -1

    def session_size(self) -> int:
        """Processes in the main shell's session, the shell included."""
        return int(self._control(f"__sao_count {self.sid}"))

    def oom_kills(self) -> int:
        """The container cgroup's OOM-kill counter (-1 when the cgroup files are not readable)."""
        try:
            return int(self._control("__sao_oom"))
        except (ShellExited, TimeoutError, ValueError):
            return -1

    def close(self) -> None:
        for ex in (self.main, self.control):
            if ex is not None:
                ex.close()
