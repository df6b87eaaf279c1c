"""Ray for `sao train`: the session (local on 127.0.0.1, or a cluster) and waits that always end.

Every wait on an actor has a timeout and a message saying what it waited for (`get`); what ends the
loop raises `LoopError`.
"""
from __future__ import annotations

import os
import time

STARTUP_TIMEOUT = "timed out during startup"  # Ray's message when its raylet has not registered within 30 s
STARTUP_ATTEMPTS = 2


class LoopError(RuntimeError):
    """The loop cannot go on (a timeout, a dead engine, workers dying); the message says why."""


def start_ray(ray_address: str | None, log=print) -> bool:
    """Connect to `ray_address` (runtime.ray_address), or start a local Ray on 127.0.0.1 only; True if we started it.

    A process that already called `ray.init` (tests, notebooks) keeps its session. Ray replaces a
    loopback node address by the host's outward one unless it is told this is not a cluster, so the
    local start sets that switch: then every Ray server binds 127.0.0.1 only. It also keeps Ray's workers
    at niceness 0: Ray starts them at 15 by default (`worker_niceness`), where beside two busy processes an
    engine replica gets about 3% of a core and its start-up takes over five minutes instead of under one.
    Ray waits a fixed 30 s for its raylet to register; on a node too busy for that, the start is tried once more.
    """
    import ray  # lazy: heavy

    if ray.is_initialized():
        return False
    if ray_address:
        log(f"ray: connecting to {ray_address}")
        ray.init(address=ray_address, log_to_driver=True)
        return True
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # read by Ray's processes at import
    from ray._private import ray_constants  # lazy: heavy (part of ray)

    ray_constants.ENABLE_RAY_CLUSTER = False  # this process imported Ray already
    t0 = time.monotonic()
    for attempt in range(1, STARTUP_ATTEMPTS + 1):
        try:
            ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=True,
                     _temp_dir=f"/tmp/sao-ray-{os.getuid()}", _system_config={"worker_niceness": 0})
            break
        except Exception as e:  # Ray's own exception type: only the message tells this one apart
            if STARTUP_TIMEOUT not in str(e) or attempt == STARTUP_ATTEMPTS:
                raise
            ray.shutdown()
            log(f"ray: the local raylet did not register within Ray's fixed 30 s (a busy node); "
                f"starting again ({attempt + 1}/{STARTUP_ATTEMPTS})")
    gcs = ray.get_runtime_context().gcs_address
    if not gcs.startswith("127.0.0.1:"):
        ray.shutdown()
        raise LoopError(f"the local Ray came up on {gcs}, not on 127.0.0.1; set runtime.ray_address to a cluster")
    log(f"ray: local session on {gcs} ({time.monotonic() - t0:.1f}s)")
    return True


def get(ref, timeout: float, what: str):
    """`ray.get` with a timeout; a `LoopError` saying `what` was waited for when it times out or the actor died."""
    import ray  # lazy: heavy
    from ray.exceptions import GetTimeoutError, RayActorError  # lazy: heavy

    try:
        return ray.get(ref, timeout=timeout)
    except GetTimeoutError:
        raise LoopError(f"{what}: no answer within {timeout:g}s") from None
    except RayActorError as e:
        raise LoopError(f"{what}: the actor died: {e}") from None


def is_done(ref) -> bool:
    """True when the call behind `ref` has ended (returned or raised); never waits."""
    import ray  # lazy: heavy

    return bool(ray.wait([ref], timeout=0)[0])
