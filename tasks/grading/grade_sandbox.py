"""The grading container is a sandbox: it runs the patch's code, so it gets the agent sandbox's limits.

- ``GradeLimits.from_config(sandbox_cfg, output_cap_bytes)``: memory (= memory + swap), CPUs, pids and
  the disk budget from ``sandbox.*`` (``envs.config.SandboxConfig``), plus the test-output cap.
- ``hardened_kwargs(limits)``: the ``containers.create`` settings of every grading container: network
  none, ``cap_drop=ALL`` (no capability added back), ``no-new-privileges``, the limits, SIGKILL; and,
  given the client, the hard disk cap (``sandbox.disk_bytes`` of writes) where the
  engine's storage driver enforces one (``envs.limits.hard_disk_cap``).
- ``run_capped(container, cmd, timeout_s=, cap_bytes=)``: one exec whose output is streamed and kept up
  to ``cap_bytes``; past the cap (``over_cap``) or the timeout (``timed_out``) the container is killed.
- ``install_swebench_hooks()`` (once per process): swebench's eval containers (``sweb.eval.*``) are
  created with ``hardened_kwargs`` of the grading in flight on this thread (``grading_limits``), and
  its eval script runs through ``run_capped``: output over the cap raises ``OutputCapExceeded`` (the
  run yields no report) and is recorded in ``grading_limits(...)``'s state, as is a timeout once the
  tests had started (``tests_started``: the patch's doing); no output at all raises ``EvalOutputLost``
  (no report: an infra failure). Patching
  ``client.containers.create`` does not work: ``.containers`` is a new object on each access, so
  ``ContainerCollection.create`` is wrapped.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from sao_harness.envs.config import SandboxConfig, size_bytes
from sao_harness.envs.limits import hard_disk_cap

DEFAULT_OUTPUT_CAP_BYTES = 16_000_000  # = grading.output_cap_bytes's default
OWNER_LABEL = "sao-harness.owner"


class OutputCapExceeded(RuntimeError):
    """The tests printed more than the grading output cap (a patch failure, not an infra failure)."""


class EvalOutputLost(RuntimeError):
    """The eval script's exec returned no output at all. swebench's eval script traces every command
    (``set -x``) from its first line, before any code of the patch runs, so a real run always prints:
    the engine lost the output (an infra failure, never an unresolved verdict)."""


@dataclass(frozen=True)
class GradeLimits:
    memory: str = "2g"
    cpus: float = 1.0
    pids_limit: int = 512
    output_cap_bytes: int = DEFAULT_OUTPUT_CAP_BYTES
    disk_bytes: int = size_bytes(SandboxConfig().disk_bytes)

    @classmethod
    def from_config(cls, sandbox: SandboxConfig | None = None, output_cap_bytes: int | None = None) -> GradeLimits:
        s = sandbox or SandboxConfig()
        return cls(s.memory, s.cpus, s.pids_limit, int(output_cap_bytes or DEFAULT_OUTPUT_CAP_BYTES),
                   size_bytes(s.disk_bytes))


def hardened_kwargs(limits: GradeLimits, client=None) -> dict:
    """``containers.create`` keyword arguments that make a grading container a sandbox (see doc)."""
    kwargs = dict(network_mode="none", cap_drop=["ALL"], cap_add=None, security_opt=["no-new-privileges"],
                  mem_limit=limits.memory, memswap_limit=limits.memory, pids_limit=limits.pids_limit,
                  nano_cpus=int(limits.cpus * 1e9), stop_signal="SIGKILL")
    if client is not None:
        kwargs.update(hard_disk_cap(client, limits.disk_bytes))
    return kwargs


@dataclass
class ExecOutput:
    output: bytes
    exit_code: int | None
    timed_out: bool = False
    over_cap: bool = False
    seconds: float = 0.0


def _kill(container) -> None:
    try:
        container.kill()
    except Exception:  # already gone / stopped: the caller removes it
        pass


def run_capped(container, cmd, *, timeout_s: float, cap_bytes: int, workdir: str | None = None,
               user: str = "root") -> ExecOutput:
    """Run ``cmd`` in ``container`` keeping at most ``cap_bytes`` of output (see module doc)."""
    api = container.client.api
    t0 = time.monotonic()
    exec_id = api.exec_create(container.id, cmd, workdir=workdir, user=user)["Id"]
    chunks: list[bytes] = []
    state = {"size": 0, "over": False, "error": None}
    done = threading.Event()  # the stream ended or went over the cap

    def read() -> None:
        try:
            for chunk in api.exec_start(exec_id, stream=True):
                if state["over"]:
                    continue  # drained, not kept, till the kill ends it: unread, it held the kill and stop up 10 s each
                room = cap_bytes - state["size"]
                if len(chunk) > room:
                    chunks.append(chunk[:room])
                    state["size"], state["over"] = cap_bytes, True
                    done.set()
                    continue
                chunks.append(chunk)
                state["size"] += len(chunk)
        except Exception as e:  # the stream broke (container killed, engine gone)
            state["error"] = e
        finally:
            done.set()

    reader = threading.Thread(target=read, daemon=True, name="sao-grade-exec")
    reader.start()
    done.wait(timeout_s)
    timed_out = not done.is_set()
    if state["over"] or timed_out:
        _kill(container)
        reader.join(10)
    elif state["error"] is not None:
        raise state["error"]
    code = None
    if not (state["over"] or timed_out):
        code = api.exec_inspect(exec_id).get("ExitCode")
    return ExecOutput(b"".join(chunks), code, timed_out, state["over"], time.monotonic() - t0)


# --- swebench's eval containers ---------------------------------------------------------------
def tests_started(output: bytes | str) -> bool:
    """Did the eval script reach its tests? swebench's script traces ``: '>>>>> Start Test Output'`` right
    before the test command. A timeout after it is the patch's code running past the limit (reward 0);
    before it, the setup hung (infra). The bundled tasks' setup runs none of the patch's code; an eval
    script that reinstalls the package before its tests (some SWE-bench repositories do) runs the
    patch's build code there, and a patch that hangs it is still an infra failure (docs/threats.md)."""
    from swebench.harness.constants import START_TEST_OUTPUT  # lazy: swebench is heavy

    marker = START_TEST_OUTPUT if isinstance(output, str) else START_TEST_OUTPUT.encode()
    return marker in output


@dataclass
class _Grading:
    limits: GradeLimits
    over_cap: bool = False
    tests_timed_out: bool = False  # the eval script ran past the timeout after its tests had started
    containers: list[str] = field(default_factory=list)


_local = threading.local()
_hook_lock = threading.Lock()
_hooked = False


@contextmanager
def grading_limits(limits: GradeLimits):
    """Swebench runs on this thread inside the block use ``limits``; yields their shared state."""
    prev = getattr(_local, "grading", None)
    _local.grading = state = _Grading(limits)
    try:
        yield state
    finally:
        _local.grading = prev


def _current() -> _Grading:
    return getattr(_local, "grading", None) or _Grading(GradeLimits())


def install_swebench_hooks() -> None:
    """Wrap container creation and swebench's eval exec once per process (see module doc)."""
    global _hooked
    with _hook_lock:
        if _hooked:
            return
        # lazy: docker-py and swebench are heavy
        import swebench.harness.run_evaluation as run_evaluation
        from docker.models.containers import ContainerCollection

        original = ContainerCollection.create

        def create(self, image, command=None, **kwargs):
            if str(kwargs.get("name", "")).startswith("sweb.eval."):
                kwargs.pop("network", None)
                kwargs.update(hardened_kwargs(_current().limits, self.client))
                labels = dict(kwargs.get("labels") or {})
                labels.setdefault(OWNER_LABEL, "grade")
                kwargs["labels"] = labels
            return original(self, image, command, **kwargs)

        def exec_run_with_timeout(container, cmd, timeout=60):
            g = _current()
            g.containers.append(container.name)
            out = run_capped(container, cmd, timeout_s=timeout or 60, cap_bytes=g.limits.output_cap_bytes)
            if out.over_cap:
                g.over_cap = True
                raise OutputCapExceeded(f"test output over the cap of {g.limits.output_cap_bytes} bytes")
            if out.timed_out and tests_started(out.output):
                g.tests_timed_out = True
            if not out.output and not out.timed_out:
                raise EvalOutputLost(f"the eval script's exec in {container.name} returned no output (exit "
                                     f"{out.exit_code}): the engine lost it")
            return out.output.decode(errors="replace"), out.timed_out, out.seconds

        create.__wrapped__ = original  # type: ignore[attr-defined]
        ContainerCollection.create = create
        run_evaluation.exec_run_with_timeout = exec_run_with_timeout
        _hooked = True
