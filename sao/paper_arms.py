"""The experiments of `sao paper`: its arms (overrides of one SAO config) and the paper's claims with their arms."""
from __future__ import annotations

from dataclasses import dataclass

# The arms: overrides of the SAO base (paper.yaml's trainer section). Every arm with a critic pretrains it
# for paper.pretrain_steps critic-only updates (trainer.critic_only_steps), counted on top of its policy steps.
NO_CRITIC = ["trainer.critic_only_steps=0", "trainer.critic_steps=0"]
ARMS: dict[str, list[str]] = {
    "sao": [],
    "grpo": ["trainer.mode=sync", "trainer.advantage=grpo", "trainer.policy_loss=ppo", *NO_CRITIC],
    "grpo+dis": ["trainer.mode=sync", "trainer.advantage=grpo", "trainer.policy_loss=dis", *NO_CRITIC],
    "vapo": ["trainer.mode=sync", "trainer.policy_loss=ppo", "trainer.critic_freeze=none"],
    "sao-k1": ["trainer.critic_steps=1"],
    "sao-full-critic": ["trainer.critic_freeze=none"],
    "sao-no-pretrain": ["trainer.critic_only_steps=0"],
    "sao-gae-obs": ["trainer.skip_observations=false"],
    "sao-lambda-0.95": ["trainer.policy_lambda=0.95"],
    "sao-stale-1": ["trainer.max_staleness=1"],
    "sao-stale-16": ["trainer.max_staleness=16"],
    "no-correction": ["trainer.policy_loss=ppo", "trainer.importance=none"],
    "tis": ["trainer.policy_loss=ppo", "trainer.importance=tis"],
    "sao-sync": ["trainer.mode=sync"],
    "sao-online": [],  # + testbed.chain.shift_every
    "running-mean-online": ["trainer.advantage=running_mean", "trainer.running_mean_scope=global",
                            "trainer.running_mean_window=128", *NO_CRITIC],
}
ONLINE = ("sao-online", "running-mean-online")
ALONE = ("sao", "sao-sync")  # C7 compares their wall clocks: when C7 runs, they never run beside another run


@dataclass(frozen=True)
class Claim:
    """One claim of the paper: its id, title, the arms its experiment runs, and the paper's own result."""

    id: str
    title: str
    arms: tuple[str, ...]
    paper: str


CLAIMS = (
    Claim("C1", "stability", ("sao", "grpo", "grpo+dis", "vapo"),
          "GRPO collapses at about step 160, VAPO at about 90; SAO trains stably to about step 1000"),
    Claim("C2", "sample efficiency", ("sao", "grpo"),
          "a single rollout per task reaches a given reward with fewer trajectories than GRPO's groups"),
    Claim("C3", "the critic", ("sao", "sao-k1", "sao-full-critic", "sao-no-pretrain"),
          "K = 2 critic steps, a frozen-attention critic and value pretraining each make the critic better"),
    Claim("C4", "observation-skipping GAE", ("sao", "sao-gae-obs"),
          "GAE over action tokens only beats GAE through observation tokens"),
    Claim("C5", "length-adaptive lambda", ("sao", "sao-lambda-0.95"),
          "lambda = 1 - 1/(alpha l) beats a fixed 0.95 on long episodes"),
    Claim("C6", "staleness", ("sao-stale-1", "sao", "sao-stale-16", "no-correction", "tis"),
          "DIS keeps stale asynchronous rollouts useful, where no correction and TIS do worse"),
    Claim("C7", "async vs sync", ("sao", "sao-sync"),
          "without a group barrier the engine is never idle waiting on the longest episode: more trajectories "
          "per minute"),
    Claim("C8", "online learning", ONLINE,
          "when the reward's preference shifts, SAO's critic re-adapts faster than a running-mean baseline"),
)
C1_ARMS = CLAIMS[0].arms
