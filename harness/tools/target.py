"""The container target: how the sandbox tools reach a running container through the Docker API.

Contract:
- ``SandboxTarget(container, workdir="/testbed", ...)`` names a running container (id or name) and
  how to reach it (``DOCKER_HOST`` from the environment unless given); ``.docker()`` is the docker-py
  client, ``.cli()`` / ``.cli_env()`` the ``docker`` CLI and the only host environment it gets.
- ``SandboxUnavailable``: the container is gone or Docker failed (an infrastructure failure);
  ``.check_running()`` raises it unless the container is running.
- ``SandboxBroken``: the container runs but a tool cannot work in it (the agent removed or broke
  ``bash``, ...). The agent's doing: the SDK shows it to the agent as the tool's error, the episode
  goes on, and it is never an infrastructure failure.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from typing import Any

# Host environment the docker CLI needs (nothing else of the host reaches the container).
_CLI_ENV_KEYS = ("PATH", "HOME", "DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CERT_PATH", "DOCKER_TLS_VERIFY",
                 "DOCKER_CONTEXT", "DOCKER_API_VERSION")


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot be reached (container gone, Docker error): an infrastructure failure."""


class SandboxBroken(RuntimeError):
    """The container runs, but a tool cannot start or read in it: the agent broke it (a tool error)."""


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
    def from_sandbox(cls, sb) -> SandboxTarget:
        """The target of an ``envs.sandbox.Sandbox`` (its container already carries its environment)."""
        return cls(container=sb.container_id, workdir=sb.workdir, user=sb.cfg.user,
                   docker_host=sb.docker_host, client=sb.client)

    def docker(self):
        if self.client is None:
            import docker  # lazy: docker-py is a heavy dependency

            self.client = (docker.DockerClient(base_url=self.docker_host, timeout=120) if self.docker_host
                           else docker.from_env(timeout=120))
        return self.client

    def check_running(self) -> None:
        """``SandboxUnavailable`` unless the container is running."""
        import docker  # lazy: docker-py is a heavy dependency

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

