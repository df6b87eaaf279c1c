"""Config section for the trainer: every switch of sao.md sections 1-6.

Defaults follow sao.md; the tag says where a default comes from ([paper] or [choice]).
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class TrainerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # loop (used by the training loop, build step 7)
    mode: Literal["async", "sync"] = "async"  # async: SAO single rollouts; sync: group barrier (GRPO)
    batch_size: int = Field(128, gt=0)  # trajectories per policy step [paper]
    group_size: int = Field(8, gt=0)  # sync mode: rollouts per task (G)
    max_steps: int = Field(1000, gt=0)  # policy steps to run
    max_staleness: int = Field(4, ge=0)  # in policy versions, from the oldest token; older are dropped and counted
    save_every: int = Field(10, gt=0)  # checkpoint every N policy steps

    # estimator / loss switches
    advantage: Literal["gae", "grpo", "running_mean"] = "gae"  # gae needs the critic; the others do not use it
    policy_loss: Literal["dis", "ppo"] = "dis"  # dis: sao.md section 1; ppo: clipped surrogate vs pi_old
    importance: Literal["none", "tis", "mis"] = "none"  # ppo only: correction pi_old / pi_rollout
    tis_cap: float = Field(2.0, gt=0)  # TIS: weight = min(pi_old / pi_rollout, tis_cap)
    mis_low: float = Field(0.5, ge=0)  # token-MIS / IcePop: keep tokens with mis_low <= ratio <= mis_high
    mis_high: float = Field(2.0, gt=0)  # [choice: the window matching tis_cap]
    skip_observations: bool = True  # True: observation-skipping GAE; False: GAE through observations (ablation)
    gamma: float = Field(1.0, ge=0, le=1)  # discount [choice]
    critic_lambda: float = Field(1.0, ge=0, le=1)  # lambda of the critic's targets [paper]
    policy_lambda: Literal["adaptive"] | float = "adaptive"  # "adaptive": 1 - 1/(alpha * l); or a fixed value
    lambda_alpha: float = Field(1.5, gt=0)  # alpha of the length-adaptive lambda [paper]
    whiten_advantages: bool = True  # whiten over the batch's action tokens [choice]
    grpo_eps: float = Field(1e-6, gt=0)  # GRPO: A = (R - mean) / (std + grpo_eps)
    running_mean_window: int | None = Field(None, gt=0)  # None: 8 per task, 128 global (sao.md section 6)
    running_mean_scope: Literal["task", "global"] = "task"  # window per task or one global window

    # DIS / PPO windows
    eps_low: float = Field(0.8, ge=0, le=1)  # DIS keeps ratios in (1 - eps_low, 1 + eps_high) [paper, coding]
    eps_high: float = Field(3.0, ge=0)
    dis_grad: Literal["score", "literal"] = "score"  # score: grad = m r A grad logp; literal: differentiate Eq. 1
    dis_denominator: Literal["all", "kept"] = "all"  # N = all action tokens, or only the unmasked ones
    ppo_clip_low: float = Field(0.2, ge=0, le=1)  # PPO clip-higher window (1 - low, 1 + high)
    ppo_clip_high: float = Field(0.28, ge=0)

    # sampling of the rollout engine: the trainer recomputes logprobs of this same distribution
    # The sampling distribution the logprobs are recomputed under. Left unset in a run config, they are
    # copied from `sampling.*` (harness.config); set to other values, it is a config error (r_t != 1 on-policy).
    temperature: float = Field(1.0, gt=0)
    top_k: int = Field(0, ge=0)  # 0 = off
    top_p: float = Field(1.0, gt=0, le=1)  # 1 = off

    # critic
    critic_steps: int = Field(2, ge=0)  # K critic optimizer steps per policy step [paper]
    critic_freeze: Literal["none", "attention"] = "attention"  # attention: self_attn frozen [paper]
    critic_freeze_norms: bool = True  # with critic_freeze=attention: freeze the RMS norms too [choice]
    critic_freeze_router: bool = True  # with critic_freeze=attention: freeze the MoE router (mlp.gate) [choice]
    critic_freeze_embeddings: bool = True  # with critic_freeze=attention: freeze the token embeddings [choice]
    critic_warmup_steps: int = Field(10, ge=0)  # linear LR warm-up of the critic, in critic optimizer steps
    critic_only_steps: int = Field(0, ge=0)  # updates that train only the critic before the first policy step
    value_clip: float | None = Field(None, gt=0)  # clip V - V_old to +-value_clip in the value loss (None: off)
    value_pretrain_checkpoint: str | None = None  # critic directory written by value pretraining (None: from policy)

    # optimisation
    lr: float = Field(1e-6, gt=0)  # policy AdamW learning rate [paper]
    critic_lr: float = Field(5e-6, gt=0)  # critic AdamW learning rate [paper]
    weight_decay: float = Field(0.0, ge=0)  # AdamW weight decay, both models
    max_grad_norm: float = Field(1.0, gt=0)  # gradient-norm clip, both models
    logprob_chunk: int = Field(1024, gt=0)  # positions per chunk for token logprobs and entropy
    micro_batch_tokens: int = Field(32_768, gt=0)  # padded tokens per forward/backward micro-batch
    gradient_checkpointing: bool = False  # transformers' activation checkpointing (long sequences)

    # the loop (sao train)
    env: Literal["swe", "simulated"] = "swe"  # swe: OpenHands episodes in Docker; simulated: a sleeping env (bench)
    ray_address: str | None = None  # None: start a local Ray; else the address of a cluster
    keep_checkpoints: int = Field(3, gt=0)  # checkpoints kept in <run>/checkpoints
    # waits of the loop: each one that runs out is an error naming what it waited for (no hangs)
    poll_interval_s: float = Field(0.2, gt=0)  # how often the trainer looks for new trace shards
    batch_timeout_s: float = Field(1800.0, gt=0)  # waiting for a batch with no new trajectory for this long: error
    publish_timeout_s: float = Field(300.0, gt=0)  # a weight update the engine has not applied within this: error
    actor_timeout_s: float = Field(600.0, gt=0)  # starting the engine / workers, stopping them, other actor calls
    # env=simulated (tests, bench): real generations through the proxy, synthetic observations, sleeps
    sim_turns_median: float = Field(4.0, gt=0)  # turns per episode ~ LogNormal(log(median), sigma), in [1, max]
    sim_turns_sigma: float = Field(0.0, ge=0)  # 0: every episode has `median` turns
    sim_turns_max: int = Field(16, gt=0)
    sim_env_sleep_s: float = Field(0.02, ge=0)  # the environment's time per turn (the "tool execution")
    sim_infra_error_rate: float = Field(0.0, ge=0, le=1)  # fraction of episodes that end as injected infra_error
    sim_engine_s: float | None = Field(None, gt=0)  # None: the configured engine generates; a number: a stand-in
    #                                               engine that sleeps this long per turn (bench: the pipeline, not the model)

    @model_validator(mode="after")
    def _check_combinations(self) -> "TrainerConfig":
        if self.policy_loss == "dis" and self.importance != "none":
            raise ValueError("importance must be 'none' with policy_loss='dis': DIS already weights by "
                             "pi_theta / pi_rollout; TIS / MIS correct the PPO ratio against pi_old")
        if self.critic_only_steps and self.advantage != "gae":
            raise ValueError(f"critic_only_steps needs advantage='gae' (advantage={self.advantage!r} trains no critic)")
        if self.mis_low > self.mis_high:
            raise ValueError(f"mis_low ({self.mis_low}) must be <= mis_high ({self.mis_high})")
        if isinstance(self.policy_lambda, float) and not 0.0 <= self.policy_lambda <= 1.0:
            raise ValueError(f"policy_lambda must be 'adaptive' or a number in [0, 1], got {self.policy_lambda}")
        return self

    @property
    def window(self) -> int:
        """The running-mean window: running_mean_window, or 8 per task / 128 global."""
        if self.running_mean_window is not None:
            return self.running_mean_window
        return 8 if self.running_mean_scope == "task" else 128


class ValuePretrainConfig(BaseModel):
    """`sao value-pretrain`: regress the critic on Monte-Carlo returns of stored trajectories."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    traces: list[str] = []  # trace stores (run dirs / traces dirs / shards); empty = <run>/traces
    max_steps: int = Field(200, gt=0)  # step budget
    batch_size: int = Field(16, gt=0)  # trajectories per critic step
    lr: float = Field(5e-6, gt=0)  # critic AdamW learning rate (constant; weight decay / grad clip from trainer.*)
    patience: int = Field(20, gt=0)  # stop when neither value loss nor explained variance improved for this many steps
    min_delta: float = Field(1e-3, ge=0)  # what counts as an improvement
    smoothing: float = Field(0.9, ge=0, lt=1)  # the plateau test runs on an EMA of the per-batch metrics (0 = raw)
    eval_trajectories: int = Field(64, ge=0)  # fixed sample of the corpus scored before and after (0 = off)
    device: str = "cpu"  # torch device of the critic ("cpu", "cuda", "cuda:1", ...)
