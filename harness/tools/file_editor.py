"""The file editor tool: the SDK's unmodified ``FileEditor`` on per-call host copies of container files.

Contract:
- ``SandboxFileEditorExecutor(target)``: each call fetches exactly the container paths the command
  reads (one ``docker exec`` probe) into a fresh host *shadow* directory, runs the SDK editor there,
  copies what it wrote back with ``put_archive`` (or ``cat`` in the container where the archive API
  cannot write) and maps host paths back to container paths in every text the model sees. The
  agent's files exist in the container only; the undo history lives on the host, keyed by path.
- Host safety: a file is fetched by ONE bounded read (``head -c`` of at most the size limit + 1
  bytes, so a file swapped after its ``stat`` cannot get more through); a file over the SDK's size
  limit, or sparse, is refused with the SDK's too-large error before anything is copied; host copies
  get only ``mode & 0o777`` (never setuid / setgid / sticky); no agent-visible text carries the host
  shadow directory.
- A Docker failure raises ``SandboxUnavailable`` (kept in ``.failure``); a probe that fails every
  time in a running container (the agent removed ``bash``, ...) raises ``SandboxBroken``, the call's
  error for the agent.
- It relies on private SDK attributes (``FileEditor._max_file_size``, ``._history_manager``);
  ``tests/harness/test_sdk_pins.py`` pins them.
"""
from __future__ import annotations

import io
import os
import shutil
import socket
import struct
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openhands.tools.file_editor.definition import (
    FileEditorAction,
    FileEditorObservation,
)
from openhands.tools.file_editor.exceptions import (
    EditorToolParameterInvalidError,
    FileValidationError,
)
from openhands.tools.file_editor.impl import FileEditorExecutor

from sao_harness.harness.tools.target import SandboxBroken, SandboxTarget, SandboxUnavailable

# One round trip: the container user, the type of each probed path, a directory listing (children and
# non-hidden grandchildren, following symlinks like Path.is_dir/iterdir), and a regular file's bytes.
_PROBE = r'''
set -u
max=$1; list=$2; fetch=$3; shift 3
printf 'U\0%s\0%s\0' "$(id -u)" "$(id -g)"
for p in "$@"; do
  if [ -d "$p" ]; then t=d; elif [ -f "$p" ]; then t=f; elif [ -e "$p" ]; then t=o; else t=n; fi
  s=$( [ "$t" = n ] && echo "0 0 0 0" || stat -L -c '%s %f %u %g %b %B' -- "$p" 2>/dev/null || echo "0 0 0 0")
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
  exec timeout -s KILL 60 head -c "$((max + 1))" -- "$fetch"
fi
printf 'N\0'
'''

PROBE_ATTEMPTS = 3  # a probe reply that does not parse is asked for again, up to this many probes in all
SPARSE_SLACK = 1 << 20  # a file with more holes than this (apparent size - allocated bytes) is refused


@dataclass
class _Stat:
    kind: str  # d (dir), f (regular file), o (other), n (missing)
    size: int = 0
    mode: int = 0o644
    uid: int = 0
    gid: int = 0
    disk: int = -1  # bytes allocated (st_blocks * block size); -1 = unknown


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
        size, mode_hex, suid, sgid, blocks, bsize = (field_().split() + ["0", "0", "0", "0", "-1", "1"])[:6]
        stats.append(_Stat(kind, int(size), int(mode_hex, 16) & 0o7777 if mode_hex != "0" else 0o644,
                           int(suid), int(sgid), int(blocks) * int(bsize)))
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
        import docker  # lazy: docker-py is a heavy dependency

        api = self.target.docker().api
        try:
            ex = api.exec_create(self.target.container, argv, stdout=True, stderr=True,
                                 user=self.target.user or "", workdir="/")
            out, err = api.exec_start(ex["Id"], demux=True)
        except docker.errors.DockerException as e:
            raise SandboxUnavailable(f"docker exec in {self.target.container} failed: {e}") from e
        return ex["Id"], out or b"", err or b""

    def _probe(self, paths: list[str], list_dir: str | None, fetch: str | None) -> _Probe:
        """One probe round trip -> _Probe. The probe only reads, so a reply that does not parse is asked
        for again (PROBE_ATTEMPTS in all): the engine now and then loses the output of a short exec
        (exit 0, nothing read; seen about once in 250 episodes), which is not the sandbox being gone."""
        max_bytes = self.editor._max_file_size
        argv = ["bash", "-c", _PROBE, "probe", str(max_bytes), list_dir or "-", fetch or "-", *paths]
        for _ in range(PROBE_ATTEMPTS):
            exec_id, out, err = self._exec(argv)
            try:
                return _parse_probe(out, len(paths))
            except (ValueError, IndexError) as e:
                self.target.check_running()
                cause = e
        try:  # still running after every attempt: what the agent did to it, not infrastructure
            rc = self.target.docker().api.exec_inspect(exec_id).get("ExitCode")
        except Exception:
            rc = None
        detail = (err or out).decode(errors="replace")[-300:]
        raise SandboxBroken(f"the file editor cannot read the sandbox: `bash` there failed {PROBE_ATTEMPTS} "
                            f"times (last exit {rc}): {detail!r}") from cause

    def _upload(self, cpath: str, data: bytes, mode: int, uid: int, gid: int) -> str | None:
        """Write ``data`` to ``cpath`` in the container; None, or the error the write ran into.

        ``put_archive`` first (keeps owner and mode); where the archive API cannot write (a tmpfs, a
        read-only root) ``cat`` in the container does, as the container user, and its error is the agent's.
        """
        import docker  # lazy: docker-py is a heavy dependency

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
        import docker  # lazy: docker-py is a heavy dependency

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
                    f.truncate(min(st.size, self.editor._max_file_size + 1) if st.kind == "f" else 0)  # sparse

    def _unmap(self, text: str, shadow_path: str, shown: str) -> str:
        return text.replace(shadow_path, shown).replace(self.shadow, "")

    def __call__(self, action: FileEditorAction, conversation=None) -> FileEditorObservation:
        self.calls += 1
        try:
            with self._lock:  # one shadow directory: one call at a time
                return self._scrub(self._call(action, conversation))
        except SandboxUnavailable as e:
            self.failure = e
            raise
        except Exception as e:  # the SDK shows the agent a tool's exception: never with the host shadow path
            if self.shadow not in str(e):
                raise
            raise RuntimeError(str(e).replace(self.shadow, "")) from e

    def _scrub(self, obs: FileEditorObservation) -> FileEditorObservation:
        """No host path in what the agent sees: the shadow directory is the container's root."""
        if self.shadow not in obs.text and self.shadow not in str(obs.path or ""):
            return obs
        content = [c.model_copy(update={"text": c.text.replace(self.shadow, "")}) if hasattr(c, "text") else c
                   for c in obs.content]
        path = obs.path.replace(self.shadow, "") or "/" if obs.path is not None else None
        return obs.model_copy(update={"content": content, "path": path})

    def _refusal(self, st: _Stat) -> str | None:
        """The SDK's too-large reason for a file it must not copy (over the limit, or sparse), else None."""
        max_size = self.editor._max_file_size
        if st.kind != "f":
            return None
        if st.size > max_size:
            return (f"File is too large ({st.size / 1024 / 1024:.1f}MB). "
                    f"Maximum allowed size is {int(max_size / 1024 / 1024)}MB.")
        if 0 <= st.disk < st.size - SPARSE_SLACK:
            return (f"File is too large ({st.size / 1024 / 1024:.1f}MB, sparse: "
                    f"{st.disk / 1024 / 1024:.1f}MB allocated). Sparse files are not supported.")
        return None

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
        refused = self._refusal(target) if action.command != "create" else None
        if refused is None and target.kind == "f" and probe.content is not None and (
                len(probe.content) > self.editor._max_file_size):  # grew after its stat: refuse what was read
            target.size, refused = len(probe.content), self._refusal(_Stat("f", len(probe.content)))
        if refused is not None:
            target.size, probe.content = 0, None  # nothing of it reaches the host
        self._stub(cpath, target)
        if target.kind == "d":
            for kind, rel in probe.entries:
                self._stub(cpath.rstrip("/") + "/" + rel, _Stat("d" if kind == "d" else "o"))
        host = self._host(cpath)
        if refused is not None:
            err = FileValidationError(path=host, reason=refused)
            return FileEditorObservation.from_text(text=self._unmap(err.message, host, str(Path(path))),
                                                   command=action.command, is_error=True)
        if fetch and target.kind == "f" and probe.content is None and target.size <= self.editor._max_file_size:
            shown = str(Path(path))  # not readable by the container user: the error the SDK editor gives
            return FileEditorObservation.from_text(
                text=f"Ran into [Errno 13] Permission denied: '{shown}' while trying to read {shown}",
                command=action.command, is_error=True)
        if target.kind == "f" and probe.content is not None:
            with open(host, "wb") as f:
                f.write(probe.content)
            os.chmod(host, target.mode & 0o777)  # never a setuid / setgid file on the host
        before = probe.content if target.kind == "f" else None
        obs = super().__call__(action.model_copy(update={"path": host}), conversation)
        if action.command != "view" and not obs.is_error and os.path.isfile(host) and not os.path.islink(host):
            with open(host, "rb") as f:
                data = f.read()
            mode = os.stat(host).st_mode & 0o777 | (target.mode & 0o7000 if target.kind == "f" else 0)
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
