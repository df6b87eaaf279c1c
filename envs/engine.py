"""Find a Docker engine, or start the project's own ``dockerd`` (root only).

Contract:
- ``ensure_engine(cfg)`` returns a ``docker.DockerClient`` for an engine that answers, starting the
  project engine when none does, and sets ``os.environ["DOCKER_HOST"]`` so every other client in
  this process (``docker.from_env()`` in ``swebench``, the ``docker`` CLI) finds the same engine.
- ``docker_client(cfg)`` is the same without starting anything (``EngineGone`` when none answers).
- Every client keeps up to ``pool_size()`` connections to its engine: ``MAX_POOL``, or more after
  ``ensure_pool(n)`` (a process running many episodes at once: ``harness.capacity``).
- The project engine has its own socket, data root, exec root and pid file under
  ``cfg.state_dir`` (outside the repo, so images survive a fresh clone) and a daemon config without
  bridge, iptables, forwarding or masquerading: only the ``host`` and ``none`` networks exist, so no
  private-range address is ever used. It runs detached (its own session) and outlives the command;
  its log is ``<state_dir>/dockerd.log``. With ``docker.disk_quota: true`` its data root is
  ``<state_dir>/btrfs``, a btrfs filesystem in ``<state_dir>/data.btrfs`` (``envs.datafs``), and it
  runs the ``btrfs`` storage driver, so every container's disk can be capped hard
  (``envs.limits.hard_disk_cap``); otherwise (or when that mount cannot be made) ``<state_dir>/data``.
- Everything of a project engine hangs off its ``state_dir`` (its dockerd starts its own containerd
  under the exec root), so ``start_project_engine(DockerConfig(state_dir=D))`` runs another engine
  beside it, untouched by and not touching the first; ``stop_project_engine`` with the same config
  stops it (the two-engine test of ``tests/envs/test_images_pull.py``).
"""
from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sao_harness.envs.config import DockerConfig, size_bytes
from sao_harness.envs.datafs import mount_data_fs
from sao_harness.envs.errors import EngineError, EngineGone
from sao_harness.envs.hostpkg import ensure_programs, which
from sao_harness.envs.limits import HARD_CAP_DRIVERS

DEFAULT_SOCKET = "unix:///var/run/docker.sock"
PROBE_TIMEOUT_S = 30  # a live engine answers slowly under load (every episode probes); a dead one refuses at once
CLIENT_TIMEOUT_S = 300
MAX_POOL = 64  # connections a client keeps to its engine, at least (ensure_pool raises it for the process)
_pool_size = MAX_POOL


@dataclass(frozen=True)
class ProjectEngine:
    """Paths of the project engine under ``state_dir``."""

    state_dir: Path

    @property
    def socket(self) -> Path:
        return self.state_dir / "docker.sock"

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    @property
    def data_root(self) -> Path:
        return self.state_dir / "data"

    @property
    def exec_root(self) -> Path:
        return self.state_dir / "exec"

    @property
    def pidfile(self) -> Path:
        return self.state_dir / "dockerd.pid"

    @property
    def config_file(self) -> Path:
        return self.state_dir / "daemon.json"

    @property
    def log_file(self) -> Path:
        return self.state_dir / "dockerd.log"

    @property
    def lock_file(self) -> Path:
        return self.state_dir / "engine.lock"

    @property
    def btrfs_root(self) -> Path:
        return self.state_dir / "btrfs"

    @property
    def data_image(self) -> Path:
        return self.state_dir / "data.btrfs"

    def daemon_config(self, btrfs: bool = False) -> dict:
        """dockerd's config: data root and storage driver on the btrfs mount, or on the host filesystem
        (dockerd's choice of driver: overlay2 on ext4 / xfs)."""
        conf = {
            "hosts": [self.url],
            "data-root": str(self.btrfs_root if btrfs else self.data_root),
            "exec-root": str(self.exec_root),
            "pidfile": str(self.pidfile),
            "bridge": "none",
            "iptables": False,
            "ip-forward": False,
            "ip-masq": False,
            "containerd-namespace": "sao-harness",
            "containerd-plugins-namespace": "sao-harness-plugins",
            "log-level": "warn",
        }
        if btrfs:
            conf["storage-driver"] = "btrfs"
        return conf

    def pid(self) -> int | None:
        """PID of the running project dockerd, or None."""
        try:
            pid = int(self.pidfile.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        return pid if str(self.config_file).encode() in cmdline else None


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def pool_size() -> int:
    """Connections each client made from now on keeps to its engine (``ensure_pool``)."""
    return _pool_size


def ensure_pool(connections: int) -> int:
    """Clients made from now on keep up to ``connections`` connections to their engine (never fewer than
    ``MAX_POOL``): a thread past a client's pool gets a connection of its own, closed after its call with
    urllib3's "Connection pool is full" warning. Returns the size in force."""
    global _pool_size
    _pool_size = max(_pool_size, connections)
    return _pool_size


def _client(url: str, timeout: float = CLIENT_TIMEOUT_S):
    import docker  # lazy: docker-py is heavy (it pulls in requests)

    size = pool_size()
    client = docker.DockerClient(base_url=url, timeout=timeout, max_pool_size=size)
    client.sao_docker_host = url  # the URL a `docker` CLI needs (client.api.base_url is rewritten)
    client.sao_pool_size = size
    return client


def probe(url: str, timeout: float = PROBE_TIMEOUT_S) -> tuple[bool, str]:
    """(answers, reason) for the engine at ``url``."""
    if url.startswith("unix://") and not os.path.exists(url[len("unix://"):]):
        return False, f"no socket at {url[len('unix://'):]}"
    try:
        c = _client(url, timeout)
        try:
            c.ping()
        finally:
            c.close()
        return True, "ok"
    except Exception as e:  # docker raises a zoo of requests/urllib3/OSError types here
        return False, str(e).splitlines()[0][:200]


def _cli_context_host() -> str | None:
    """The endpoint of the docker CLI's current context (Docker Desktop, rootless, remote), if any."""
    docker_cli = which("docker")
    if docker_cli is None:
        return None
    try:
        out = subprocess.run([docker_cli, "context", "inspect", "--format", "{{.Endpoints.docker.Host}}"],
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    host = out.stdout.strip()
    return host if out.returncode == 0 and "://" in host else None


def candidates(cfg: DockerConfig) -> list[str]:
    """Engine URLs to try, in order: ``docker.host`` alone if set; else DOCKER_HOST, the default
    socket, the docker CLI's current context, the rootless socket, the project engine."""
    if cfg.host:
        return [cfg.host]
    urls = []
    env = os.environ.get("DOCKER_HOST")
    if env:
        urls.append(env)
    urls.append(DEFAULT_SOCKET)
    if not env:
        ctx = _cli_context_host()
        if ctx:
            urls.append(ctx)
        if os.environ.get("XDG_RUNTIME_DIR"):
            urls.append(f"unix://{os.environ['XDG_RUNTIME_DIR']}/docker.sock")
    urls.append(ProjectEngine(cfg.state_dir).url)
    return list(dict.fromkeys(urls))


def find_engine(cfg: DockerConfig) -> tuple[str | None, list[str]]:
    """(url of the first engine that answers or None, reasons of those that did not)."""
    reasons = []
    for url in candidates(cfg):
        ok, why = probe(url)
        if ok:
            return url, reasons
        reasons.append(f"{url}: {why}")
    return None, reasons


def _use(url: str):
    os.environ["DOCKER_HOST"] = url
    return _client(url)


def docker_client(cfg: DockerConfig | None = None):
    """Client for the engine in use (no engine is started); ``EngineGone`` if none answers."""
    cfg = cfg or DockerConfig()
    url, reasons = find_engine(cfg)
    if url is None:
        raise EngineGone("no Docker engine answers (" + "; ".join(reasons) + "); start one with `sao docker up`")
    return _use(url)


def ensure_engine(cfg: DockerConfig | None = None, *, log=_log):
    """Client for an engine that answers, starting the project engine if needed (see module doc)."""
    cfg = cfg or DockerConfig()
    url, reasons = find_engine(cfg)
    if url is not None:
        return _use(url)
    if cfg.host:
        raise EngineError(f"docker.host={cfg.host} does not answer ({reasons[0].split(': ', 1)[1]})")
    if os.geteuid() != 0:
        eng = ProjectEngine(cfg.state_dir)
        raise EngineError(
            "no Docker engine answers (" + "; ".join(reasons) + "). Start one: install Docker and "
            "run its service (e.g. `sudo systemctl start docker`, and join the `docker` group), or let "
            f"root start the project engine with `sudo .venv/bin/sao docker up` (then DOCKER_HOST={eng.url})")
    return _use(start_project_engine(cfg, log=log))


def _netns_wanted(cfg: DockerConfig) -> bool:
    if cfg.netns is not None:
        return cfg.netns
    return Path("/sys/class/net/docker0").exists()


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.strip().splitlines()[-lines:]) or "(empty log)"


def start_project_engine(cfg: DockerConfig, *, log=_log) -> str:
    """Start the project dockerd (idempotent, locked against concurrent starts); return its URL."""
    eng = ProjectEngine(cfg.state_dir)
    eng.state_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(eng.state_dir, 0o711)
    with open(eng.lock_file, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ok, _ = probe(eng.url)
        if ok:
            return eng.url
        ensure_programs({"dockerd": "docker.io", "containerd": "containerd", "runc": "runc"}, log=log)
        proc = None
        if eng.pid() is not None:  # alive but not answering: wait for it below rather than start another
            log(f"docker: project dockerd (pid {eng.pid()}) is running but not answering yet; waiting")
        else:
            proc = _spawn(cfg, eng, log)
        _wait_ready(cfg, eng, proc)
        log(f"docker: project engine answers at {eng.url}")
    return eng.url


def _spawn(cfg: DockerConfig, eng: ProjectEngine, log) -> subprocess.Popen:
    quota = cfg.disk_quota and mount_data_fs(eng.btrfs_root, eng.data_image, size_bytes(cfg.data_fs_size), log)
    if not quota:
        eng.data_root.mkdir(parents=True, exist_ok=True)
    elif eng.data_root.is_dir() and any(eng.data_root.iterdir()):
        log(f"docker: {eng.data_root} (images made on the host filesystem, without disk caps) is not used; "
            "its images are rebuilt on btrfs as needed (`make images`), and the directory can be removed")
    eng.exec_root.mkdir(parents=True, exist_ok=True)
    eng.socket.unlink(missing_ok=True)
    eng.config_file.write_text(json.dumps(eng.daemon_config(btrfs=quota), indent=2) + "\n")
    argv = [which("dockerd") or "dockerd", "--config-file", str(eng.config_file)]
    if _netns_wanted(cfg):
        argv = [which("unshare") or "unshare", "--net", *argv]
    env = dict(os.environ)
    env["PATH"] = env.get("PATH", "") + ":/usr/sbin:/sbin"
    log(f"docker: starting project engine ({' '.join(argv)}), log {eng.log_file}")
    with open(eng.log_file, "ab") as out:
        out.write(f"\n--- sao-harness: start {time.strftime('%Y-%m-%dT%H:%M:%S')} ---\n".encode())
        out.flush()
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env,
                                start_new_session=True, close_fds=True, cwd="/")


def _wait_ready(cfg: DockerConfig, eng: ProjectEngine, proc: subprocess.Popen | None) -> None:
    t0 = time.monotonic()
    why = ""
    while time.monotonic() - t0 < cfg.start_timeout_s:
        ok, why = probe(eng.url, timeout=2)
        if ok:
            return
        if proc is not None and proc.poll() is not None:
            why = f"dockerd exited with code {proc.returncode}"
            break
        time.sleep(0.1)
    raise EngineError(f"project dockerd did not answer within {cfg.start_timeout_s:g} s ({why}); "
                      f"log tail of {eng.log_file}:\n{_log_tail(eng.log_file)}")


def stop_project_engine(cfg: DockerConfig, timeout_s: float = 30.0) -> bool:
    """Stop the project dockerd if it runs (its containers stop with it); False if it was not running."""
    eng = ProjectEngine(cfg.state_dir)
    pid = eng.pid()
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if not Path(f"/proc/{pid}").exists() or eng.pid() is None:
            return True
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    return True


def engine_status(cfg: DockerConfig) -> dict:
    """Which engine answers and what it is (for `sao docker status`)."""
    url, reasons = find_engine(cfg)
    eng = ProjectEngine(cfg.state_dir)
    status = {"url": url, "project_engine": url == eng.url, "project_pid": eng.pid(),
              "state_dir": str(eng.state_dir), "unreachable": reasons}
    if url is not None:
        c = _client(url, PROBE_TIMEOUT_S)
        try:
            v = c.version()
            info = c.info()
            status.update(server_version=v.get("Version"), api_version=v.get("ApiVersion"),
                          storage_driver=info.get("Driver"), hard_disk_cap=info.get("Driver") in HARD_CAP_DRIVERS,
                          docker_root=info.get("DockerRootDir"),
                          containers=info.get("Containers"), images=info.get("Images"),
                          networks=sorted(n.name for n in c.networks.list()))
        finally:
            c.close()
    return status
