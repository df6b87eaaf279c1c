"""Turn docker-py / requests exceptions into the typed ``envs.errors`` faults."""
from __future__ import annotations

import os
from contextlib import contextmanager

from sao_harness.envs.errors import EngineGone, SandboxError


def is_engine_failure(exc: BaseException) -> bool:
    """True when ``exc`` means the engine did not answer (socket gone, refused, reset, timed out)."""
    # lazy: docker-py and requests (its transport) are heavy; only a failing engine call needs them
    import docker
    import requests

    if isinstance(exc, (requests.exceptions.ConnectionError, requests.exceptions.Timeout, ConnectionError)):
        return True
    if isinstance(exc, (docker.errors.APIError, OSError)):
        return False  # the engine answered (APIError), or a local file problem
    text = str(exc)
    return any(s in text for s in ("Connection aborted", "Connection refused", "No such file or directory",
                                   "Error while fetching server API version", "Read timed out"))


@contextmanager
def engine_calls(what: str):
    """Re-raise engine-unreachable errors as ``EngineGone`` naming ``what`` and the engine."""
    try:
        yield
    except SandboxError:
        raise
    except Exception as e:
        if is_engine_failure(e):
            host = os.environ.get("DOCKER_HOST", "the default socket")
            raise EngineGone(f"Docker engine at {host} unreachable while {what}: "
                             f"{str(e).splitlines()[0][:200] if str(e) else type(e).__name__}") from e
        raise
