"""Config sections of the trainer: `trainer` (the algorithm, docs/algorithm.md), `runtime` (where and how
`sao train` runs it), `value_pretrain`, `sft`, `cluster` (the GPU nodes of the GPU plan).

Defaults follow docs/algorithm.md; the tag says where a default comes from ([paper] or [choice]).
The sampling distribution the trainer recomputes logprobs under is the rollout's, `sampling.*`.
"""
from __future__ import annotations

import warnings
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from sao_harness.core.config import Section
from sao_harness.harness.runner import check_env

# model.dtype float16 refused: trainer.modeling.precision.autocast at training time, sao.config at load time
FLOAT16_UNSUPPORTED = ("model.dtype: float16 is not supported by the trainer, use bfloat16 or float32: fp16 "
                       "autocast needs loss scaling (gradients below fp16's ~6e-8 flush to zero, above 65504 "
                       "overflow) and the trainer has no loss scaler; bfloat16 has fp32's range")


class TrainerConfig(Section):
    """`sao train`: the loop, the advantage estimator, the policy loss, the critic and the optimisers."""

    # the training loop (trainer.run.loop)
    mode: Literal["async", "sync"] = Field("async", description="async: SAO single rollouts; sync: a group "
                                           "barrier per task (GRPO)")
    batch_size: int = Field(128, gt=0, description="trajectories per policy step [paper]")
    group_size: int = Field(8, gt=0, description="sync mode: rollouts per task (G)")
    max_steps: int = Field(1000, gt=0, description="policy steps to run")
    max_minutes: float | None = Field(None, gt=0, description="wall-clock budget of this process's training loop: "
                                      "the first step that ends past it is checkpointed and the run stops; null = "
                                      "max_steps alone decides")
    max_staleness: int = Field(4, ge=0, description="how many policy versions a trajectory's oldest token may lag "
                               "behind; older trajectories are dropped and counted")
    save_every: int = Field(10, gt=0, description="checkpoint every N policy steps")

    # estimator / loss switches
    advantage: Literal["gae", "grpo", "running_mean"] = Field("gae", description="advantage estimator: gae "
                                                              "needs the critic; grpo and running_mean do not "
                                                              "use it")
    policy_loss: Literal["dis", "ppo"] = Field("dis", description="dis: direct double-sided importance sampling "
                                               "(docs/algorithm.md); ppo: clipped surrogate against pi_old")
    importance: Literal["none", "tis", "mis"] = Field("none", description="ppo only: correction of pi_old / "
                                                      "pi_rollout (tis: truncated, mis: masked)")
    tis_cap: float = Field(2.0, gt=0, description="TIS: weight = min(pi_old / pi_rollout, tis_cap)")
    mis_low: float = Field(0.5, ge=0, description="token-MIS / IcePop: keep tokens with mis_low <= ratio <= "
                           "mis_high")
    mis_high: float = Field(2.0, gt=0, description="token-MIS / IcePop: upper end of the kept ratio window "
                            "[choice: matches tis_cap]")
    skip_observations: bool = Field(True, description="true: observation-skipping GAE; false: GAE through "
                                    "observation tokens (ablation)")
    gamma: float = Field(1.0, ge=0, le=1, description="discount [choice]")
    critic_lambda: float = Field(1.0, ge=0, le=1, description="GAE lambda of the critic's targets [paper]")
    policy_lambda: Literal["adaptive"] | float = Field("adaptive", description="GAE lambda of the policy's "
                                                       "advantages: `adaptive` = 1 - 1/(lambda_alpha * l) for "
                                                       "an episode of l action tokens, or a fixed value in [0, 1]")
    lambda_alpha: float = Field(1.5, gt=0, description="alpha of the length-adaptive lambda [paper]")
    whiten_advantages: bool = Field(True, description="whiten advantages over the batch's action tokens "
                                    "[choice]; gae and running_mean only (GRPO's are already normalised per group)")
    grpo_eps: float = Field(1e-6, gt=0, description="GRPO: A = (R - mean) / (std + grpo_eps)")
    running_mean_window: int | None = Field(None, gt=0, description="running_mean: how many recent rewards the "
                                            "baseline averages; null = 8 per task, 128 global")
    running_mean_scope: Literal["task", "global"] = Field("task", description="running_mean: one window per "
                                                          "task, or one global window")

    # DIS / PPO windows
    eps_low: float = Field(0.8, ge=0, le=1, description="DIS keeps ratios in (1 - eps_low, 1 + eps_high) "
                           "[paper, coding]")
    eps_high: float = Field(3.0, ge=0, description="DIS window upper side: ratios >= 1 + eps_high are masked "
                            "[paper: 3.0]")
    dis_grad: Literal["score", "literal"] = Field("score", description="score: grad = m r A grad logp; literal: "
                                                  "differentiate the DIS objective as written")
    dis_denominator: Literal["all", "kept"] = Field("all", description="DIS normaliser N: all action tokens, or "
                                                    "only the unmasked ones")
    ppo_clip_low: float = Field(0.2, ge=0, le=1, description="PPO clip-higher window (1 - low, 1 + high): lower "
                                "epsilon")
    ppo_clip_high: float = Field(0.28, ge=0, description="PPO clip-higher window: upper epsilon")
    ppo_epochs: int = Field(1, gt=0, description="policy_loss=ppo: passes over the batch per update, each "
                            "against pi_old (the policy before this update)")
    minibatches: int = Field(1, gt=0, description="policy_loss=ppo: optimizer steps per epoch, each on a "
                             "contiguous slice of the batch's trajectories (1 with ppo_epochs=1: one step, "
                             "ratio 1, the clip never binds)")

    # critic
    critic_steps: int = Field(2, ge=0, description="K critic optimizer steps per policy step [paper]")
    critic_freeze: Literal["none", "attention"] = Field("attention", description="attention: the critic's "
                                                        "self_attn weights are frozen [paper]; none: all train")
    critic_freeze_norms: bool = Field(True, description="with critic_freeze=attention: freeze the RMS norms too "
                                      "[choice]")
    critic_freeze_router: bool = Field(True, description="with critic_freeze=attention: freeze the MoE router "
                                       "(mlp.gate) [choice]")
    critic_freeze_embeddings: bool = Field(True, description="with critic_freeze=attention: freeze the token "
                                           "embeddings [choice]")
    critic_warmup_steps: int = Field(10, ge=0, description="linear LR warm-up of the critic, in critic optimizer "
                                     "steps")
    critic_only_steps: int = Field(0, ge=0, description="updates that train only the critic before the first "
                                   "policy step (needs advantage=gae)")
    value_clip: float | None = Field(None, gt=0, description="clip V - V_old to +-value_clip in the value loss; "
                                     "null = off")
    value_pretrain_checkpoint: str | None = Field(None, description="critic directory written by `sao "
                                                  "value-pretrain`; null = the critic starts from the policy")

    # optimisation
    lr: float = Field(1e-6, gt=0, description="policy AdamW learning rate [paper]")
    lr_warmup_steps: int = Field(0, ge=0, description="linear LR warm-up of the policy, in policy optimizer steps "
                                 "(lr * min(1, n/N) at step n); 0 = off")
    critic_lr: float = Field(5e-6, gt=0, description="critic AdamW learning rate [paper]")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay, both models")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient-norm clip, both models")
    logprob_chunk: int = Field(1024, gt=0, description="positions per chunk for token logprobs and entropy")
    router_replay: Literal["auto", "on", "off"] = Field("auto", description="routing replay on an MoE policy "
                                                        "(trainer.router_replay): on = the policy's routers take "
                                                        "the experts the engine recorded (a trace without them is "
                                                        "refused); auto = on for the traces that carry routes; "
                                                        "off = the trainer's own routing (the agreement is still "
                                                        "measured)")
    attn_impl: Literal["auto", "sdpa_packed", "flex", "flash_varlen"] = Field(
        "auto", description="attention on packed micro-batches (trainer.modeling.models.use_packed_attention): "
        "sdpa_packed = SDPA per trajectory (a Python loop); flex = one FlexAttention kernel under a document "
        "block mask (no backward on CPU); flash_varlen = flash-attention's varlen kernel (CUDA and the flash_attn "
        "package); auto = flash_varlen on CUDA with flash_attn, else flex on CUDA, sdpa_packed on CPU")
    max_tokens_per_microbatch: int = Field(32_768, gt=0, description="tokens per forward/backward micro-batch: "
                                           "whole trajectories packed end to end, no padding (a longer "
                                           "trajectory is a micro-batch of its own)")
    gradient_checkpointing: bool = Field(False, description="transformers' activation checkpointing (long "
                                         "sequences)")
    checkpoint_above_tokens: int | None = Field(8192, gt=0, description="activation checkpointing per decoder "
                                                "layer in a forward whose micro-batch holds more tokens than "
                                                "this (null = off; gradient_checkpointing=true: always on)")

    # the loop (sao train)
    env: str = Field("swe", description="the episode function (harness.runner.ENVS): swe = OpenHands episodes "
                     "in Docker; the test-beds (harness.testbeds): simulated = real generations and sleeps (tests, "
                     "bench; testbed.simulated.*), toy = the learning test-bed (testbed.toy.*), chain = the "
                     "long-horizon test-bed (testbed.chain.*)")

    @field_validator("router_replay", mode="before")
    @classmethod
    def _yaml_on_off(cls, v: Any) -> Any:
        """YAML reads a bare on / off as a boolean: true is "on", false is "off"."""
        return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v

    @field_validator("env")
    @classmethod
    def _registered_env(cls, v: str) -> str:
        return check_env(v)  # ValueError listing the known envs

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        """trainer.micro_batch_tokens (padded tokens per micro-batch) became max_tokens_per_microbatch."""
        if isinstance(data, dict) and "micro_batch_tokens" in data:
            if "max_tokens_per_microbatch" in data:
                raise ValueError("micro_batch_tokens: deprecated, and max_tokens_per_microbatch is set too; "
                                 "keep only max_tokens_per_microbatch")
            warnings.warn("trainer.micro_batch_tokens is deprecated: use trainer.max_tokens_per_microbatch "
                          "(packed tokens, no padding)", FutureWarning, stacklevel=2)
            data = {k: v for k, v in data.items() if k != "micro_batch_tokens"} | {
                "max_tokens_per_microbatch": data["micro_batch_tokens"]}
        return data

    @model_validator(mode="after")
    def _check_combinations(self) -> TrainerConfig:
        if self.policy_loss == "dis" and self.importance != "none":
            raise ValueError("importance must be 'none' with policy_loss='dis': DIS already weights by "
                             "pi_theta / pi_rollout; TIS / MIS correct the PPO ratio against pi_old")
        if self.critic_only_steps and self.advantage != "gae":
            raise ValueError(f"critic_only_steps needs advantage='gae' (advantage={self.advantage!r} trains no critic)")
        if self.policy_loss != "ppo" and self.ppo_epochs * self.minibatches > 1:
            raise ValueError("ppo_epochs / minibatches > 1 need policy_loss='ppo' (DIS makes one step per "
                             "batch against the rollout logprobs)")
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


class RuntimeConfig(Section):
    """`sao train`'s processes: Ray, the trainer ranks and their device, how weights reach the engine, the waits
    of the loop, the checkpoints kept."""

    ray_address: str | None = Field(None, description="address of a Ray cluster; null = start a local Ray")
    world_size: int = Field(1, gt=0, description="data-parallel trainer processes (FSDP2, trainer.dist.distributed): "
                            "gloo on CPU, NCCL on GPU; Ray places them over the cluster's nodes")
    device: str = Field("cpu", description="torch device of the policy and critic master weights and of "
                        "every training pass (\"cpu\", \"cuda\", \"cuda:1\", ...); forward passes run in "
                        "model.dtype under autocast")
    offload_optimizer: bool = Field(False, description="world_size > 1: keep the fp32 master shards, their "
                                    "gradients and the AdamW states in CPU memory (FSDP2 CPUOffloadPolicy; the "
                                    "optimizer steps on the CPU)")
    weight_sync: Literal["auto", "object_store", "collective"] = Field(
        "auto", description="how published weights reach the engine replicas: object_store (a state dict through "
        "Ray's object store), collective (a torch.distributed broadcast, trainer -> every replica: gloo on CPU, "
        "NCCL on GPU); auto = collective for vllm, object_store otherwise")
    weight_bucket_mb: float = Field(256.0, gt=0, description="collective: megabytes per broadcast bucket")
    weight_sync_host: str | None = Field(None, description="collective: the trainer's address the replicas "
                                         "connect to; null = the driver's Ray node address (127.0.0.1 locally)")
    keep_checkpoints: int = Field(3, gt=0, description="checkpoints kept in `<run>/checkpoints`")
    # waits of the loop: each one that runs out is an error naming what it waited for (no hangs)
    poll_interval_s: float = Field(0.2, gt=0, description="seconds between the trainer's looks for new trace "
                                   "shards")
    batch_timeout_s: float = Field(1800.0, gt=0, description="seconds without a new trajectory while filling a "
                                   "batch, then an error")
    publish_timeout_s: float = Field(300.0, gt=0, description="seconds for the engine to apply a weight update, "
                                     "then an error")
    actor_timeout_s: float = Field(600.0, gt=0, description="seconds for other actor calls: starting and "
                                   "stopping the engine and the workers")


class ValuePretrainConfig(Section):
    """`sao value-pretrain`: regress the critic on Monte-Carlo returns of stored trajectories."""

    traces: list[str] = Field([], description="trace stores (run dirs, traces dirs or shards); empty = "
                              "`<run>/traces`")
    max_steps: int = Field(200, gt=0, description="critic steps at most")
    batch_size: int = Field(16, gt=0, description="trajectories per critic step")
    lr: float = Field(5e-6, gt=0, description="critic AdamW learning rate (constant; weight decay and grad clip "
                      "from trainer.*)")
    patience: int = Field(20, gt=0, description="stop when neither the value loss nor the explained variance "
                          "improved for this many steps")
    min_delta: float = Field(1e-3, ge=0, description="the smallest change that counts as an improvement")
    smoothing: float = Field(0.9, ge=0, lt=1, description="the plateau test runs on an EMA of the per-batch "
                             "metrics with this decay (0 = raw)")
    eval_trajectories: int = Field(64, ge=0, description="fixed sample of the corpus scored before and after "
                                   "(0 = off)")
    device: str = Field("cpu", description='torch device of the critic ("cpu", "cuda", "cuda:1", ...)')


class SFTConfig(Section):
    """`sao sft`: supervised warm start (TRL SFTTrainer) on the action tokens of stored trajectories."""

    traces: list[str] = Field([], description="trace stores (run dirs, traces dirs or shards); empty = "
                              "`<run>/traces`")
    select: Literal["resolved", "positive", "all"] = Field("resolved", description="which trajectories to imitate: "
                                                           "resolved = status ok and reward 1; positive = reward > "
                                                           "0; all = every one with an action token")
    out_dir: str | None = Field(None, description="where the model directory (model + tokenizer) is written; "
                                "null = `<run>/sft/model`")
    lr: float = Field(1e-5, gt=0, description="AdamW learning rate [choice]")
    lr_schedule: Literal["linear", "constant"] = Field("linear", description="linear: decay to 0 over the run; "
                                                      "constant: the same lr throughout (a run of N steps is the "
                                                      "first N steps of a longer one)")
    epochs: float = Field(3.0, gt=0, description="passes over the examples (unless max_steps is set)")
    batch_size: int = Field(1, gt=0, description="examples (token sequences) per micro-batch, padded to the longest")
    grad_accum: int = Field(1, gt=0, description="micro-batches per optimizer step")
    max_steps: int | None = Field(None, gt=0, description="optimizer steps; null = epochs decide")
    max_length: int | None = Field(None, gt=0, description="tokens per example at most (cut at the end); null = "
                                   "the longest example; cutting off all of an example's actions is an error")
    router_aux_loss_coef: float = Field(0.0, ge=0, description="MoE load-balancing loss weight (0 = off, as in "
                                        "`sao train`); the saved config keeps the input model's either way")
    gradient_checkpointing: bool = Field(False, description="transformers' activation checkpointing (long "
                                         "sequences)")
    device: Literal["cpu", "cuda"] = Field("cpu", description="cpu, or cuda (the visible GPU; bf16 mixed "
                                           "precision where supported)")


class ClusterConfig(Section):
    """The GPU nodes a run is given: `sao config` prints the GPU plan on them and any command refuses a plan
    that does not fit (trainer.gpu_plan)."""

    nodes: int = Field(0, ge=0, description="GPU nodes for the trainer ranks and the engine replicas together; 0 = "
                       "none described (no GPU plan)")
    gpus_per_node: int = Field(8, gt=0, description="GPUs on each node")
    gpu_memory_bytes: int = Field(80 * 2**30, gt=0, description="memory of one GPU in bytes (an 80 GB card: "
                                  "80 GiB); the trainer may use 0.9 of it, the engine gpu_memory_utilization")
    host_memory_bytes: int | None = Field(None, gt=0, description="host memory of a trainer node in bytes, for "
                                          "the offloaded optimizer state; null = not checked")
