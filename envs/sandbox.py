"""A hardened Docker container with a persistent shell, file I/O and patch extraction.

Contract (``Sandbox(image, cfg)``, a context manager; ``close()`` removes everything it made):
- The container's PID 1 is ``KEEPALIVE``, a bash that ignores every signal it can and reaps orphans:
  PID 1 gets no signal without a handler from inside its namespace, so the agent, even as root,
  cannot stop the container (which would turn its episode into an infra error). Network ``cfg.network`` (default
  none), memory (= memory+swap), CPU and pids limits, ``no-new-privileges``, ``cap_drop=ALL`` plus
  ``cfg.cap_add``, stop signal SIGKILL, optional read-only root (tmpfs /tmp, a volume at the
  workdir), and the ``envs.labels`` run labels (the volume too).
- ``run(cmd, timeout_s)`` -> ``CommandResult`` (output capped at ``cfg.output_cap_chars``, exit
  code, duration) through one persistent bash (cwd / env persist). Faults are typed:
  ``CommandTimeout`` (processes killed, shell usable), ``OOMKilled``, ``ContainerDied``,
  ``EngineGone``; an image that does not exist is ``ImageNotFound``.
- Disk: no file may exceed ``cfg.disk_bytes`` (``RLIMIT_FSIZE``: the write fails at once). Where the
  storage driver allows it (the project engine on btrfs), the kernel refuses any write past
  ``cfg.disk_bytes`` (``envs.limits.hard_disk_cap``; the write fails with EDQUOT
  and the sandbox lives on). Elsewhere, and for the workdir volume, a watchdog thread polls the
  usage every ``cfg.disk_check_s`` and kills the container once it exceeds ``cfg.disk_bytes``; every
  later call then raises ``DiskLimitExceeded`` (the agent's doing, not infrastructure).
- ``read_file`` / ``write_file`` go through the Docker archive API (any size, any bytes).
- ``diff(base_commit)``: ``git add -A`` then the binary-safe diff of the index against the base,
  produced and read back bounded: over ``cfg.max_patch_bytes`` it raises ``PatchTooLarge``.
- For tools that attach themselves (the OpenHands terminal): ``container_id``, ``name``,
  ``docker_host``, ``exec_argv()`` and ``docker_env()``.
"""
from __future__ import annotations

import io
import os
import posixpath
import re
import secrets
import shlex
import sys
import tarfile
import time

from sao_harness.core.slots import node_slot
from sao_harness.envs.config import SandboxConfig, size_bytes
from sao_harness.envs.engine import docker_client
from sao_harness.envs.errors import (
    CommandTimeout,
    ContainerDied,
    EngineError,
    ImageNotFound,
    OOMKilled,
    SandboxError,
)
from sao_harness.envs.faults import engine_calls
from sao_harness.envs.labels import current_run_id, run_labels
from sao_harness.envs.limits import DiskLimitExceeded, DiskWatchdog, PatchTooLarge, PatchUnavailable, hard_disk_cap
from sao_harness.envs.shell import PersistentShell, ShellExited, ShellResult, ShellTimeout

CommandResult = ShellResult
KIND_KEY = "sao-harness.kind"
IMAGE_KEY = "sao-harness.image"
# PID 1 of every sandbox: signals ignored (SIGKILL / SIGSTOP never reach PID 1 from inside); waiting on a
# child sleep, bash reaps every exited child, the orphans it adopts included; a killed sleep is restarted
KEEPALIVE = "trap '' HUP INT QUIT TERM USR1 USR2 ALRM PIPE TSTP TTIN TTOU; while :; do sleep 86400 & wait $!; done"
READ_ATTEMPTS = 3  # reads of a patch whose byte count does not match what the diff wrote


def _safe_name(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_.-]", "-", text).strip("-.")[:48] or "run"


class Sandbox:
    """See the module doc."""

    def __init__(self, image: str, cfg: SandboxConfig | None = None, *, client=None, run_id: str | None = None,
                 env: dict[str, str] | None = None, name: str | None = None, labels: dict[str, str] | None = None,
                 workdir: str | None = None):
        self.cfg = cfg or SandboxConfig()
        self.image = image
        self.run_id = run_id or current_run_id()
        self.workdir = workdir or self.cfg.workdir
        self.env = {**self.cfg.env, **(env or {})}
        self.name = name or f"sao-{_safe_name(self.run_id)}-{secrets.token_hex(4)}"
        self.container = None
        self.volume = None
        self.shell: PersistentShell | None = None
        self._closed = False
        self._oom_flag_seen = False
        self._oom_reported = False  # an OOM kill was already reported for this container
        self._ids: tuple[int, int] | None = None
        self.disk_budget = size_bytes(self.cfg.disk_bytes)
        self.watchdog: DiskWatchdog | None = None
        self.disk_cap: dict = {}  # the hard cap's create arguments, {} where the engine has none
        self.start_wait_s = 0.0  # waited for a start slot (sandbox.start_slots)
        with engine_calls(f"connecting for sandbox {self.name}"):
            self.client = client or docker_client()
        self.api = self.client.api
        self.docker_host = getattr(self.client, "sao_docker_host", None) or os.environ.get(
            "DOCKER_HOST", "unix:///var/run/docker.sock")
        self.labels = run_labels(self.run_id, **{KIND_KEY: "sandbox", IMAGE_KEY: image}, **(labels or {}))
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    # -- lifecycle ---------------------------------------------------------------------------------
    def _start(self) -> None:
        import docker  # lazy: docker-py is heavy (it pulls in requests)

        cfg = self.cfg
        kwargs = dict(
            entrypoint=["bash", "-c", KEEPALIVE], command=[], name=self.name, labels=self.labels, detach=True,
            init=False, network_mode=cfg.network, mem_limit=cfg.memory, memswap_limit=cfg.memory,
            nano_cpus=int(cfg.cpus * 1e9), pids_limit=cfg.pids_limit, security_opt=["no-new-privileges"],
            cap_drop=["ALL"], cap_add=cfg.cap_add or None, working_dir=self.workdir, environment=self.env,
            stop_signal="SIGKILL", shm_size=cfg.shm_size, hostname="sandbox",
            ulimits=[docker.types.Ulimit(name="fsize", soft=self.disk_budget, hard=self.disk_budget)],
        )
        if cfg.user:
            kwargs["user"] = cfg.user
        if cfg.read_only:
            kwargs["read_only"] = True
            kwargs["tmpfs"] = {"/tmp": f"rw,nosuid,nodev,size={cfg.tmpfs_size}"}
        with node_slot("sandbox-start", cfg.slots()) as waited:  # starts at once on this node are bounded
            self.start_wait_s = waited
            with engine_calls(f"starting sandbox {self.name} from {self.image}"):
                try:
                    self.client.images.get(self.image)
                except docker.errors.ImageNotFound:
                    raise ImageNotFound(self.image) from None
                self.disk_cap = hard_disk_cap(self.client, self.disk_budget)
                kwargs.update(self.disk_cap)
                if cfg.read_only:  # a labeled volume at the workdir, filled from the image's content
                    self.volume = self.client.volumes.create(name=f"{self.name}-work", labels=self.labels)
                    kwargs["volumes"] = {self.volume.name: {"bind": self.workdir, "mode": "rw"}}
                try:
                    self.container = self.client.containers.create(self.image, **kwargs)
                    self.container.start()
                except docker.errors.ImageNotFound:
                    raise ImageNotFound(self.image) from None
                except docker.errors.APIError as e:
                    raise SandboxError(f"cannot start sandbox from {self.image}: {e.explanation or e}") from None
                try:
                    self.shell = PersistentShell(self.api, self.container.id, user=cfg.user, workdir=self.workdir,
                                                 env=self.env, cap_chars=cfg.output_cap_chars,
                                                 ready_timeout_s=cfg.start_timeout_s)
                except (ShellExited, ShellTimeout, docker.errors.APIError) as e:
                    self._raise_if_dead("starting its shell", "")
                    raise SandboxError(f"sandbox {self.name}: its shell did not start "
                                       f"(does {self.image} have bash?)") from e
        if not self.disk_cap or self.volume is not None:  # under a hard cap only a volume needs watching
            self.watchdog = DiskWatchdog(self.api, self.container.id, self.disk_budget, cfg.disk_check_s,
                                         self.volume, self.name, layer=not self.disk_cap)

    @property
    def container_id(self) -> str:
        return self.container.id if self.container is not None else ""

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Remove the container (and its volume); idempotent, never raises."""
        if self._closed:
            return
        self._closed = True
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.shell is not None:
            self.shell.close()
        for obj in (self.container, self.volume):
            if obj is None:
                continue
            try:
                obj.remove(force=True) if obj is self.volume else obj.remove(force=True, v=True)
            except Exception as e:  # NotFound, engine gone: the gc finds leftovers by label
                if "No such" not in str(e) and "404" not in str(e):
                    print(f"sandbox {self.name}: cleanup of {getattr(obj, 'name', obj)} failed: "
                          f"{str(e).splitlines()[0][:200]}", file=sys.stderr)

    @property
    def disk_exceeded(self) -> int | None:
        """Bytes in use when the disk watchdog killed the container, or None."""
        return self.watchdog.exceeded if self.watchdog is not None else None

    def _disk_error(self, doing: str) -> DiskLimitExceeded:
        return DiskLimitExceeded(f"sandbox {self.name}: killed over its disk budget ({self.cfg.disk_bytes}: "
                                 f"{self.disk_exceeded} bytes in use) while {doing}")

    # -- state -------------------------------------------------------------------------------------
    def state(self) -> dict:
        """The container's ``State`` (``ContainerDied`` if it was removed, ``EngineGone`` if unreachable)."""
        import docker  # lazy: docker-py is heavy (it pulls in requests)

        with engine_calls(f"inspecting sandbox {self.name}"):
            try:
                return self.api.inspect_container(self.container_id)["State"]
            except docker.errors.NotFound:
                raise ContainerDied(f"sandbox {self.name}: container was removed") from None

    def _raise_if_dead(self, doing: str, output: str, wait_s: float = 0.0) -> None:
        """Raise ``OOMKilled`` / ``ContainerDied`` if the container is not running (polling ``wait_s``)."""
        deadline = time.monotonic() + wait_s
        while True:
            st = self.state()
            if not st.get("Running") or st.get("Status") != "running":
                break
            if time.monotonic() >= deadline:
                return
            time.sleep(0.05)
        code = st.get("ExitCode")
        if self.disk_exceeded is not None:
            raise self._disk_error(doing)
        if st.get("OOMKilled") and not self._oom_reported:  # the engine's flag is sticky: only news counts
            raise OOMKilled(f"sandbox {self.name}: container OOM-killed at the memory limit ({self.cfg.memory}) "
                            f"while {doing}", output, code, container_died=True)
        err = f", error {st['Error']!r}" if st.get("Error") else ""
        raise ContainerDied(f"sandbox {self.name}: container {st.get('Status', 'gone')} (exit code {code}{err}) "
                            f"while {doing}", output, code)

    def _oom_increased(self) -> bool:
        n = self.shell.oom_kills()
        if n >= 0:
            grew = n > self.shell.oom_count
            self.shell.oom_count = n
            return grew
        if self.state().get("OOMKilled") and not self._oom_flag_seen:  # no cgroup file: the engine's flag
            self._oom_flag_seen = True
            return True
        return False

    # -- commands ----------------------------------------------------------------------------------
    def run(self, command: str, timeout_s: float | None = None, *, cap_chars: int | None = None,
            check: bool = False) -> CommandResult:
        """Run ``command`` in the persistent shell (see the module doc); ``check`` raises on exit != 0."""
        if self.disk_exceeded is not None:
            raise self._disk_error(f"running {command[:80]!r}")
        if self._closed or self.shell is None:
            raise SandboxError(f"sandbox {self.name} is closed")
        timeout_s = timeout_s or self.cfg.command_timeout_s
        doing = f"running {command[:80]!r}"
        try:
            with engine_calls(f"{doing} in sandbox {self.name}"):
                res = self.shell.run(command, timeout_s, cap_chars)
        except ShellTimeout as t:
            text, _ = t.collector.output(cap_chars or self.cfg.output_cap_chars)
            self._raise_if_dead(doing, text)
            raise CommandTimeout(command, timeout_s, text) from None
        except ShellExited as e:
            res = self._after_shell_exit(doing, e)
        if res.exit_code >= 128 and self._oom_increased():
            self._oom_reported = True
            raise OOMKilled(f"sandbox {self.name}: out of memory: a process was killed at the memory limit "
                            f"({self.cfg.memory}) while {doing}", res.output, res.exit_code)
        if check and res.exit_code != 0:
            raise SandboxError(f"sandbox {self.name}: command failed (exit {res.exit_code}): {command[:200]!r}\n"
                               f"{res.output[-2000:]}")
        return res

    def _after_shell_exit(self, doing: str, e: ShellExited) -> CommandResult:
        """The shell's stream ended: a dead container is a typed fault; a shell that exited is replaced."""
        code = e.exit_code
        self._raise_if_dead(doing, e.output, wait_s=1.0 if code in (None, 137) else 0.0)
        oom = self._oom_increased()
        with engine_calls(f"restarting the shell of sandbox {self.name}"):
            self.shell.restart()
        if oom:
            self._oom_reported = True
            raise OOMKilled(f"sandbox {self.name}: out of memory: the shell was killed at the memory limit "
                            f"({self.cfg.memory}) while {doing}; a new shell was started", e.output, code)
        return CommandResult(e.output, code if code is not None else 255, 0.0, 0, self.shell.cwd)

    def kill_processes(self) -> int:
        """Kill every process the shell started (background jobs too); the shell itself stays."""
        return self.shell.kill_session()

    # -- files -------------------------------------------------------------------------------------
    def _abs(self, path: str) -> str:
        return posixpath.normpath(path if path.startswith("/") else posixpath.join(self.workdir, path))

    def _owner(self) -> tuple[int, int]:
        """uid/gid that files written through the archive API get: the sandbox's user."""
        if self._ids is None:
            user = self.cfg.user or (self.container.attrs.get("Config", {}).get("User") or "")
            m = re.fullmatch(r"(\d+)(?::(\d+))?", user)
            if user in ("", "root", "0", "0:0"):
                self._ids = (0, 0)
            elif m:
                self._ids = (int(m.group(1)), int(m.group(2) or m.group(1)))
            else:
                out = self.run("id -u; id -g", 30, check=True).output.split()
                self._ids = (int(out[0]), int(out[1]))
        return self._ids

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        """Write ``data`` to ``path`` (relative = under the workdir) through the archive API."""
        import docker  # lazy: docker-py is heavy (it pulls in requests)

        if isinstance(data, str):
            data = data.encode("utf-8")
        path = self._abs(path)
        parent, base = posixpath.split(path)
        uid, gid = self._owner()
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            info = tarfile.TarInfo(base)
            info.size, info.mode, info.mtime, info.uid, info.gid = len(data), mode, time.time(), uid, gid
            tar.addfile(info, io.BytesIO(data))
        with engine_calls(f"writing {path} in sandbox {self.name}"):
            try:
                self.api.put_archive(self.container_id, parent, buf.getvalue())
            except docker.errors.NotFound:
                self.state()  # raises ContainerDied if the container is gone
                self.run(f"mkdir -p {shlex.quote(parent)}", 30, check=True)
                self.api.put_archive(self.container_id, parent, buf.getvalue())
            except docker.errors.APIError as e:
                raise SandboxError(f"sandbox {self.name}: cannot write {path}: {e.explanation or e}") from None

    def read_file(self, path: str) -> bytes:
        """Bytes of ``path`` (relative = under the workdir); ``FileNotFoundError`` if missing."""
        import docker  # lazy: docker-py is heavy (it pulls in requests)

        path = self._abs(path)
        with engine_calls(f"reading {path} in sandbox {self.name}"):
            try:
                stream, _ = self.api.get_archive(self.container_id, path)
                blob = b"".join(stream)
            except docker.errors.NotFound:
                self.state()
                raise FileNotFoundError(f"sandbox {self.name}: no such file: {path}") from None
            except docker.errors.APIError as e:
                raise SandboxError(f"sandbox {self.name}: cannot read {path}: {e.explanation or e}") from None
        with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
            member = tar.next()
            if member is None or not member.isfile():
                raise IsADirectoryError(f"sandbox {self.name}: not a regular file: {path}")
            f = tar.extractfile(member)
            return f.read() if f else b""

    def read_text(self, path: str) -> str:
        return self.read_file(path).decode("utf-8", errors="replace")

    # -- patch -------------------------------------------------------------------------------------
    def diff_bytes(self, base_commit: str, repo: str | None = None, timeout_s: float = 120.0) -> bytes:
        """``git add -A`` then ``git diff --cached --binary <base>`` in ``repo`` (default: the workdir).

        At most ``cfg.max_patch_bytes + 1`` bytes are ever written or read back; more is ``PatchTooLarge``.
        The agent owns its sandbox, so any other failure while the container runs is ``PatchUnavailable``
        (the agent's doing); a dead container (``ContainerDied``) or engine (``EngineError``) is not.
        """
        try:
            return self._diff_bytes(base_commit, repo, timeout_s)
        except (PatchTooLarge, ContainerDied, EngineError):
            raise
        except SandboxError as e:
            self._raise_if_dead("reading the patch", "")
            raise PatchUnavailable(f"sandbox {self.name}: the running sandbox gave no patch: {e}") from e

    def _diff_bytes(self, base_commit: str, repo: str | None, timeout_s: float) -> bytes:
        repo = self._abs(repo or self.workdir)
        cap = self.cfg.max_patch_bytes
        out = f".sao-patch-{secrets.token_hex(4)}"
        q = shlex.quote
        git = f"git -C {q(repo)}"
        res = self.run(f"(d=$({git} rev-parse --absolute-git-dir) && {git} add -A && {{ {git} diff --no-color "
                       f"--no-ext-diff --binary --cached {q(base_commit)} -- | head -c {cap + 1} > \"$d/{out}\"; "
                       f"s=(\"${{PIPESTATUS[@]}}\"); [ \"${{s[0]}}\" = 0 ] || [ \"${{s[0]}}\" = 141 ]; }} "
                       f"&& echo \"$d\" && wc -c < \"$d/{out}\")", timeout_s)
        if res.exit_code != 0:
            raise SandboxError(f"sandbox {self.name}: git diff against {base_commit} in {repo} failed "
                               f"(exit {res.exit_code}): {res.output.strip()[-500:]}")
        lines = res.output.strip().splitlines()
        if len(lines) < 2 or not lines[-1].strip().isdigit():
            raise SandboxError(f"sandbox {self.name}: no patch directory and byte count in the diff's output: "
                               f"{res.output.strip()[-300:]!r}")
        git_dir, size = lines[-2], int(lines[-1])
        try:
            for _ in range(READ_ATTEMPTS):  # the engine now and then loses a short exec's output
                data = self._read_bounded(f"{git_dir}/{out}", cap + 1, timeout_s)
                if len(data) == size:
                    break
            else:  # never a short patch graded: a lost reply does not repeat, a lying head or wc does
                raise SandboxError(f"sandbox {self.name}: read {len(data)} of the patch's {size} bytes, "
                                   f"{READ_ATTEMPTS} times")
        finally:
            self.run(f"rm -f {q(git_dir + '/' + out)}", 30)
        if len(data) > cap:
            raise PatchTooLarge(f"sandbox {self.name}: the patch is over sandbox.max_patch_bytes ({cap} bytes)")
        return data

    def _read_bounded(self, path: str, limit: int, timeout_s: float) -> bytes:
        """At most ``limit`` bytes of ``path``, streamed by ``head -c`` in the container (binary-safe)."""
        argv = ["timeout", "-s", "KILL", str(int(timeout_s) + 1), "head", "-c", str(limit), "--", path]
        with engine_calls(f"reading {path} in sandbox {self.name}"):
            ex = self.api.exec_create(self.container_id, argv, stdout=True, stderr=True, user=self.cfg.user or "")
            data, err = self.api.exec_start(ex["Id"], demux=True)
            code = self.api.exec_inspect(ex["Id"]).get("ExitCode")
        if code != 0:
            self._raise_if_dead(f"reading {path}", "")
            raise SandboxError(f"sandbox {self.name}: cannot read {path} (exit {code}): "
                               f"{(err or b'').decode(errors='replace')[-300:]}")
        return data or b""

    def diff(self, base_commit: str, repo: str | None = None, timeout_s: float = 120.0) -> str:
        """The patch (text; undecodable bytes replaced) of the work tree against ``base_commit``."""
        return self.diff_bytes(base_commit, repo, timeout_s).decode("utf-8", errors="replace")

    # -- for tools that attach themselves --------------------------------------------------------
    def docker_env(self) -> dict[str, str]:
        """Environment for a ``docker`` CLI talking to this sandbox's engine."""
        return {**os.environ, "DOCKER_HOST": self.docker_host}

    def exec_argv(self, *, tty: bool = True, workdir: str | None = None, command: list[str] | None = None) -> list[str]:
        """``docker exec -it -w <workdir> [-u user] [-e K=V...] <container> bash`` for a PTY terminal."""
        argv = ["docker", "exec", "-i"] + (["-t"] if tty else []) + ["-w", workdir or self.workdir]
        if self.cfg.user:
            argv += ["-u", self.cfg.user]
        for k, v in self.env.items():
            argv += ["-e", f"{k}={v}"]
        return argv + [self.container_id] + (command or ["bash"])
