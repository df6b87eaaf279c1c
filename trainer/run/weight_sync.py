"""How published weights reach the engine replicas (`runtime.weight_sync`): every replica, or an error.

- `ObjectStoreSync` (`object_store`): one `ray.put` of the state dict; every replica's
  `update_weights` reads the same object.
- `CollectiveSync` (`collective`): a torch.distributed process group of world size 1 + N, the
  trainer rank 0 and replica i rank i + 1 (gloo on CPU, NCCL on GPU), made outside the default group
  (a `TCPStore` on the trainer plus a `ProcessGroupGloo` / `ProcessGroupNCCL` built on it, as vLLM's
  stateless groups and TRL's vLLM client do), so FSDP's default group is untouched. A publish
  announces the plan (names, dtypes, shapes, byte offsets: plain arguments of an actor call), then
  broadcasts the state dict as byte buckets of `runtime.weight_bucket_mb`; each replica unpacks them
  and loads them as the new version (the vllm engine bucket by bucket as they arrive, `receive_buckets`
  into `VLLMEngine.update_weights_stream`: the replica never holds the whole state dict). The group is
  set up by actor calls with plain arguments (the trainer's address and a free port), and set up again
  whenever a replica is replaced.

Both wait for every replica (`publish_timeout_s`) and raise `LoopError` naming the replica that did not
apply the version. The trainer side runs in the driver; `join_group` / `receive` run in the replicas.
"""
from __future__ import annotations

import datetime
import socket
import time
from typing import TYPE_CHECKING

from sao_harness.harness.engines.registry import engine_spec, weight_sync_transport
from sao_harness.trainer.run.ray_utils import LoopError, get

if TYPE_CHECKING:
    import torch


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def make_group(backend: str, host: str, port: int, rank: int, world: int, timeout_s: float, own_host: str):
    """(group, store): a process group outside torch's default one; rank 0 serves the `TCPStore` at host:port.
    `own_host` is the address this rank's gloo device binds (its node's)."""
    import torch.distributed as dist  # lazy: only the collective transport needs it

    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world, is_master=rank == 0, timeout=timeout, wait_for_workers=False)
    prefixed = dist.PrefixStore(f"sao-weights-{port}", store)
    if backend == "gloo":
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = timeout
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=own_host)]
        return dist.ProcessGroupGloo(prefixed, rank, world, opts), store
    opts = dist.ProcessGroupNCCL.Options()  # not exercised here (no GPU): written against torch's API
    opts._timeout = timeout
    return dist.ProcessGroupNCCL(prefixed, rank, world, opts), store


def broadcast(group, buf: torch.Tensor) -> None:
    import torch.distributed as dist  # lazy: only the collective transport needs it

    opts = dist.BroadcastOptions()
    opts.rootRank, opts.rootTensor = 0, 0
    group.broadcast([buf], opts).wait()


def receive(group, buckets: list[dict], device) -> dict[str, torch.Tensor]:
    """The replica side of a publish: every bucket from rank 0, unpacked into one state dict."""
    weights: dict[str, torch.Tensor] = {}
    for part in receive_buckets(group, buckets, device):
        weights.update(part)
    return weights


def receive_buckets(group, buckets: list[dict], device):
    """The replica side of a publish, one bucket at a time (a generator of name -> tensor views of that
    bucket's buffer): an engine that streams weights (`VLLMEngine.update_weights_stream`) never holds
    the whole state dict."""
    import torch  # lazy: the rollout workers and the task feed import this module and need no torch

    from sao_harness.harness.engines.vllm_weights import unpack  # lazy: imports torch

    for bucket in buckets:
        buf = torch.empty(bucket["nbytes"], dtype=torch.uint8, device=device)
        broadcast(group, buf)
        yield unpack(buf, bucket)


# --- the trainer side -------------------------------------------------------------------------------


class ObjectStoreSync:
    """The state dict through Ray's object store, one object read by every replica."""

    name = "object_store"

    def connect(self, replicas: dict) -> None:
        """Nothing to set up."""

    def close(self) -> None:
        """Nothing to tear down."""

    def publish(self, replicas: dict, version: int, weights: dict[str, torch.Tensor], timeout_s: float) -> dict:
        import ray  # lazy: heavy

        ref = ray.put(weights)
        refs = {name: a.update_weights.remote(version, ref, timeout_s) for name, a in replicas.items()}
        try:
            return _wait_all(refs, version, timeout_s)
        finally:
            del ref


class CollectiveSync:
    """A broadcast group between the trainer (rank 0) and the replicas (ranks 1..N); see the module doc."""

    name = "collective"

    def __init__(self, backend: str, host: str, bucket_mb: float, timeout_s: float, device="cpu", log=print):
        self.backend, self.host, self.timeout_s, self.device, self.log = backend, host, timeout_s, device, log
        self.bucket_bytes = int(bucket_mb * 2**20)
        self.group = self.store = None
        self.members: tuple = ()

    def connect(self, replicas: dict) -> None:
        """(Re)make the group of the trainer and `replicas` (name -> actor): ranks in the dict's order."""
        if tuple(replicas) == self.members and self.group is not None:
            return
        self.close()
        t0, world = time.monotonic(), len(replicas) + 1
        port = free_port(self.host)
        refs = {name: a.join_weight_group.remote(self.backend, self.host, port, rank, world, self.timeout_s)
                for rank, (name, a) in enumerate(replicas.items(), start=1)}
        try:
            self.group, self.store = make_group(self.backend, self.host, port, 0, world, self.timeout_s, self.host)
        except Exception as e:  # noqa: BLE001  (a replica that never joined: its call says why)
            _wait_all(refs, None, 10)
            raise LoopError(f"weight sync: the {self.backend} group on {self.host}:{port} did not form: {e}") from None
        _wait_all(refs, None, self.timeout_s)
        self.members = tuple(replicas)
        self.log(f"weight sync: {self.backend} group of the trainer and {len(replicas)} replica(s) on "
                 f"{self.host}:{port} ({time.monotonic() - t0:.1f}s)")

    def publish(self, replicas: dict, version: int, weights: dict[str, torch.Tensor], timeout_s: float) -> dict:
        from sao_harness.harness.engines.vllm_weights import pack, plan  # lazy: imports torch

        self.connect(replicas)
        buckets = plan(weights, self.bucket_bytes)
        refs = {name: a.receive_weights.remote(version, buckets, timeout_s) for name, a in replicas.items()}
        try:
            for bucket in buckets:
                broadcast(self.group, pack(weights, bucket, self.device))
        except Exception as e:  # noqa: BLE001  (a replica died or timed out mid-broadcast)
            self.close()
            _wait_all(refs, version, 10)  # names the replica when its call failed
            raise LoopError(f"publishing weights version {version}: the {self.backend} broadcast failed: {e}") \
                from None
        return _wait_all(refs, version, timeout_s)

    def close(self) -> None:
        self.group = self.store = None
        self.members = ()


def _wait_all(refs: dict, version: int | None, timeout_s: float) -> dict:
    """Each replica's answer; a `LoopError` naming the first replica that failed (its actor died, or its call
    raised: a vLLM replica whose engine core died answers EngineError) or did not answer."""
    from ray.exceptions import RayTaskError  # lazy: heavy

    what = "joining the weight group" if version is None else f"publishing weights version {version}"
    out = {}
    for name, ref in refs.items():
        try:
            out[name] = get(ref, timeout_s + 30, f"{what} to engine replica {name}")
        except RayTaskError as e:
            raise LoopError(f"{what} to engine replica {name}: {type(e.cause).__name__}: {e.cause}") from None
    return out


def make_weight_sync(rt, engine_kind: str, log=print):
    """The transport of `rt.weight_sync` (`runtime`; auto: the engine kind's first, `harness.engines.registry`)."""
    kind = weight_sync_transport(engine_kind, rt.weight_sync)
    if kind == "object_store":
        return ObjectStoreSync()
    import ray  # lazy: heavy

    gpu = engine_spec(engine_kind).collective_on_gpu and rt.device.startswith("cuda")
    host = rt.weight_sync_host or ray.util.get_node_ip_address()
    return CollectiveSync("nccl" if gpu else "gloo", host, rt.weight_bucket_mb, rt.publish_timeout_s,
                          device=rt.device if gpu else "cpu", log=log)
