"""Infra errors by kind, and the share of episodes they take (`rollout/infra_frac`, `rollout.max_infra_frac`).

An `infra_error` trajectory keeps why in `metadata.infra_error` (the reason: harness.episode, harness.runner,
the test-beds) and, where the exception was at hand, its kind in `metadata[INFRA_KIND]` (`error_kind`);
`kind_of(metadata)` reads that kind, else parses the reason (`infra_kind`). The kinds (`KINDS`, docs/traces.md):

- `docker_engine`: the Docker engine did not answer (EngineGone, EngineError, connection refused or aborted);
- `sandbox_start`: no sandbox: its image (not found, pull, build, history scrub) or its container did not start;
- `sandbox_died`: the sandbox's container stopped or vanished mid-episode (ContainerDied, SandboxUnavailable);
- `sandbox_oom`: killed at the sandbox's memory limit (OOMKilled; `oom killed: True`);
- `disk_full`: a disk is full (ENOSPC, `No space left on device`);
- `timeout`: a command or a wait ran past its timeout (CommandTimeout, `timed out`);
- `engine`: the inference engine, its replica or the proxy failed (the agent's LLM errors, `proxy ...`,
  `engine error`, a Ray actor that died);
- `grading`: the grader failed (`grading: ...`);
- `other`: anything else, a missing reason too.

`over_max_infra_frac` is the stop rule of `rollout.max_infra_frac`, the same in `sao rollout` and `sao train`.
"""
from __future__ import annotations

from collections.abc import Mapping

from sao_harness.envs.errors import (
    CommandTimeout,
    ContainerDied,
    EngineError,
    ImageBuildError,
    ImageNotFound,
    OOMKilled,
)
from sao_harness.harness.engines.protocol import EngineError as InferenceEngineError
from sao_harness.harness.trace import INFRA_KIND, Status

KINDS = ("docker_engine", "sandbox_start", "sandbox_died", "sandbox_oom", "disk_full", "timeout", "engine",
         "grading", "other")
OTHER = "other"
MIN_EPISODES = 20  # the fewest finished episodes rollout.max_infra_frac is checked on (min_episodes)

_TYPED = ((EngineError, "docker_engine"), (OOMKilled, "sandbox_oom"), (CommandTimeout, "timeout"),
          (ContainerDied, "sandbox_died"), (ImageNotFound, "sandbox_start"), (ImageBuildError, "sandbox_start"),
          (InferenceEngineError, "engine"))
_NAMES = {  # the exception type a reason opens with ("EngineGone: ...") -> its kind
    "EngineGone": "docker_engine", "OOMKilled": "sandbox_oom", "CommandTimeout": "timeout",
    "ContainerDied": "sandbox_died", "ImageNotFound": "sandbox_start", "ImagePullError": "sandbox_start",
    "ImageBuildError": "sandbox_start", "ScrubError": "sandbox_start", "EngineTimeout": "engine",
    "RayActorError": "engine", "ActorDiedError": "engine", "ActorUnavailableError": "engine",
    "GetTimeoutError": "engine", "APIError": "engine", "APIConnectionError": "engine", "APITimeoutError": "engine",
    "APIStatusError": "engine", "InternalServerError": "engine", "ServiceUnavailableError": "engine",
    "RateLimitError": "engine", "Timeout": "engine",
}
_DISK_FULL = ("no space left on device", "enospc", "errno 28")
_TEXT = (  # else the first kind with a marker in the reason (lower case), in this order
    ("engine", ("proxy", "engine error", "engine timeout", "engine core", "vllm", "replica", "litellm")),
    ("docker_engine", ("engineerror", "docker engine", "docker.host", "dockerd", "docker daemon",
                       "error while fetching server api version", "unixhttpconnectionpool", "connection aborted",
                       "read timed out")),
    ("sandbox_oom", ("oom killed: true", "oom-killed", "out of memory")),
    ("timeout", ("timed out", "timeout")),
    ("docker_engine", ("connection refused",)),
    ("sandbox_start", ("cannot start sandbox", "did not start", "not found locally", "history scrub")),
    ("sandbox_died", ("sandboxunavailable", "container was removed", "is not running", "container exited")),
)


def infra_kind(reason: str | None) -> str:
    """The kind (one of `KINDS`) of an infra error's reason, e.g. `EngineGone: Docker engine at ...` ->
    `docker_engine`, `grading: ...` -> `grading`; `other` when none fits or there is no reason."""
    if not reason:
        return OTHER
    return _kind(reason, [reason.partition(":")[0].strip()])


def error_kind(exc: BaseException) -> str:
    """The kind of the exception that ended an episode: by its type where it is a typed fault (envs.errors,
    the inference engine's), else as `infra_kind` of `TypeName: message`."""
    text = f"{type(exc).__name__}: {exc}"
    if any(m in text.lower() for m in _DISK_FULL):
        return "disk_full"
    return next((kind for cls, kind in _TYPED if isinstance(exc, cls)), None) or infra_kind(text)


def _kind(reason: str, names: list[str]) -> str:
    text = reason.lower()
    if text.startswith("grading:"):
        return "grading"
    if any(m in text for m in _DISK_FULL):
        return "disk_full"
    for name in names:
        if name in _NAMES:
            return _NAMES[name]
        if name.startswith("LLM"):  # the agent SDK's LLM errors (openhands.sdk.llm.exceptions): the proxy failed
            return "engine"
    return next((kind for kind, markers in _TEXT if any(m in text for m in markers)), OTHER)


def kind_of(metadata: Mapping) -> str:
    """An infra_error trajectory's kind: the one recorded where it failed, else its reason's (`infra_kind`)."""
    return metadata.get(INFRA_KIND) or infra_kind(metadata.get(Status.INFRA_ERROR))


def kinds_line(kinds: Mapping[str, int]) -> str:
    """`docker_engine 2, timeout 1`: the kinds counted, most first (ties by name)."""
    return ", ".join(f"{k} {n}" for k, n in sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])) if n)


def min_episodes(n: int) -> int:
    """Finished episodes before rollout.max_infra_frac is checked: max(20, 2 x n), n = trainer.batch_size
    (sao train) or rollout.workers (sao rollout), so that a few early failures do not stop a run."""
    return max(MIN_EPISODES, 2 * n)


def over_max_infra_frac(infra: int, finished: int, kinds: Mapping[str, int], max_frac: float | None,
                        at_least: int, last: str | None = None) -> str | None:
    """Why the run must stop, when `infra` of `finished` episodes are infra errors, a share over `max_frac`, and
    `at_least` episodes have finished; else None (always None when `max_frac` is None: off). `last`: a reason."""
    if max_frac is None or finished < max(at_least, 1) or infra / finished <= max_frac:
        return None
    why = (f"rollout/infra_frac {infra / finished:.3g} is over rollout.max_infra_frac {max_frac:g} after {finished} "
           f"episodes ({infra} infra errors: {kinds_line(kinds) or 'kinds not recorded'})")
    if last:
        why += f"; the last: {last[:300]}"
    return why + ("; the traces written are kept (metadata.infra_error in each says why): fix the infrastructure, "
                  "or raise rollout.max_infra_frac (null: no limit)")
