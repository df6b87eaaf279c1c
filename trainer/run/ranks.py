"""The driver's side of data-parallel `sao train` (`runtime.world_size > 1`): the rank actors of
trainer.dist.distributed behind what the loop reads of a SAOTrainer.

    update(trajectories)     one ray.put, `update` on every rank, rank 0's metrics
    policy_weights(dtype)    the gather on every rank (a collective), rank 0's state dict: what is published
    save_checkpoint(...)     every rank writes its shards and RNG states (trainer/dist/checkpoint.py), rank 0
                             the rest, rng.pt = this (the driver's) process's RNG states
    policy_version, updates, critic_optimizer_steps, policy_optimizer_steps: rank 0's `counters()`

Rank 0 runs on the driver's node and serves the process group's TCP store there: at 127.0.0.1 on a
local Ray, at the driver node's address on a cluster (`runtime.ray_address`). Every call waits at
most `runtime.actor_timeout_s`.
"""
from __future__ import annotations

import functools

import ray

from sao_harness.harness.config import SamplingConfig
from sao_harness.trainer.algo.sao import SAOTrainer
from sao_harness.trainer.config import RuntimeConfig, TrainerConfig
from sao_harness.trainer.dist import distributed
from sao_harness.trainer.dist.checkpoint import rng_state
from sao_harness.trainer.modeling.precision import engine_weights
from sao_harness.trainer.run.ray_utils import get


def publish_weights(trainer, policy, dtype: str) -> dict:
    """The weights to publish, in the engine's dtype: this process's policy, or rank 0's gather (Ranks)."""
    return trainer.policy_weights(dtype) if isinstance(trainer, Ranks) else engine_weights(policy, dtype)


class Ranks:
    """`rt.world_size` RankTrainer actors (`runtime`), each `distributed.build_sharded` from `model_path` (in
    model `dtype`, seeded with `seed`), fresh or resumed from `ckpt`."""

    def __init__(self, tc: TrainerConfig, rt: RuntimeConfig, sampling: SamplingConfig, model_path: str, dtype: str,
                 seed: int = 0, ckpt=None, log=print):
        from transformers import AutoTokenizer  # lazy: heavy

        self.world_size, self.timeout = rt.world_size, rt.actor_timeout_s
        cuda = rt.device.startswith("cuda")  # one GPU per rank: each sees its own as "cuda"
        host = ray.util.get_node_ip_address() if rt.ray_address else "127.0.0.1"
        self.tokenizer = AutoTokenizer.from_pretrained(str(ckpt / "policy") if ckpt else model_path)
        build = functools.partial(distributed.build_sharded, tc, model_path, dtype, ckpt=ckpt, seed=seed,
                                  sampling=sampling, offload=rt.offload_optimizer)
        self.actors = distributed.start_ranks(rt.world_size, build, "cuda" if cuda else "cpu", host,
                                              num_gpus=1 if cuda else 0)
        self._refresh(f"starting {self.world_size} trainer ranks")
        log(f"trainer: {self.world_size} FSDP2 ranks ({distributed.backend('cuda' if cuda else 'cpu')}, "
            f"store at {host}), policy version {self.policy_version}")

    def _all(self, method: str, what: str, *args, **kwargs):
        """`method` on every rank (they meet in collectives), rank 0's answer."""
        refs = [getattr(a, method).remote(*args, **kwargs) for a in self.actors]
        return get(refs, self.timeout, f"{what} on {self.world_size} trainer ranks")[0]

    def _refresh(self, what: str = "the trainer's counters") -> None:
        self.load_state_dict(get(self.actors[0].counters.remote(), self.timeout, what))

    def load_state_dict(self, state: dict) -> None:
        """Rank 0's counters as this driver's view (the ranks restore their own from the checkpoint)."""
        for k in SAOTrainer.COUNTERS:
            setattr(self, k, state[k])

    def state_dict(self) -> dict[str, int]:
        """Rank 0's counters (`SAOTrainer.state_dict`; the ranks restore theirs from the checkpoint)."""
        return {k: getattr(self, k) for k in SAOTrainer.COUNTERS}

    def update(self, trajectories: list) -> dict[str, float]:
        metrics = self._all("update", "the update", ray.put(trajectories))
        self._refresh()
        return metrics

    def policy_weights(self, dtype: str) -> dict:
        return self._all("policy_weights", "gathering the policy's weights", dtype)

    def save_checkpoint(self, run_dir, step: int, *, tokenizer=None, state: dict, keep: int):
        return self._all("save_checkpoint", "the checkpoint", run_dir, step, tokenizer=tokenizer, state=state,
                         keep=keep, rng=rng_state())  # the loop restores the driver's own (restore_rng)

    def close(self) -> None:
        for a in self.actors:
            ray.kill(a)
