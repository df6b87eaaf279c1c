"""Padding-free packing (trainer.algo.batch.micro_batches / pack): packed micro-batches give the padded
update, the reference computed here on the whole right-padded batch in one pass.

Packed rows are whole trajectories end to end in one [1, L] sequence, position ids restarting per
trajectory, no attention mask: transformers keeps attention inside each trajectory. Each test of
an equality also shows its power: the same pack without the position-id reset (one long sequence,
attention leaking across trajectories) is far from the reference.
"""
from __future__ import annotations

import copy
import random

import pytest
import torch

from sao_harness.harness.config import SamplingConfig
from sao_harness.harness.trace import Segment, Trajectory
from sao_harness.trainer.algo.batch import build_batch, micro_batches, pack
from sao_harness.trainer.algo.losses import value_loss
from sao_harness.trainer.algo.objective import policy_loss, training_advantages, value_mask
from sao_harness.trainer.config import TrainerConfig
from sao_harness.trainer.dist.distributed import split
from sao_harness.trainer.modeling.models import PACKED_SDPA, policy_token_logprobs, use_packed_sdpa
from tests.support.trainer_data import make_trainer, synthetic_trajectories

BUDGET = 40  # tokens per packed micro-batch: 3-5 micro-batches of 2-4 trajectories each below


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def test_micro_batches_pack_whole_rows_within_the_budget():
    batch = build_batch(synthetic_trajectories(12) + [Trajectory(task_id="e", reward=0.0, segments=[])])
    lengths = batch.attention_mask.sum(1)
    groups = micro_batches(batch, BUDGET)
    assert sorted(r for g in groups for r in g) == list(range(12))  # every row once; the empty one in none
    assert all(len(g) == 1 or int(lengths[g].sum()) <= BUDGET for g in groups)
    assert len(groups) < 12 and micro_batches(batch, BUDGET) == groups  # rows share packs; deterministic
    longest = int(lengths.argmax())
    assert [longest] in micro_batches(batch, int(lengths.max()) - 1)  # too long for any pack: alone
    part = [0, 3, 5, 7]
    assert sorted(r for g in micro_batches(batch, BUDGET, part) for r in g) == part

    mb = pack(batch, groups[0])
    assert mb.num_tokens == int(lengths[groups[0]].sum())
    for j, (row, col) in enumerate(zip(mb.batch_rows.tolist(), mb.cols.tolist())):
        assert mb.input_ids[0, j] == batch.input_ids[row, col] and mb.position_ids[0, j] == col
    assert torch.equal(mb.scatter(mb.gather(batch.logp_rollout), torch.zeros_like(batch.logp_rollout)),
                       torch.where(torch.isin(torch.arange(len(batch)), torch.tensor(groups[0]))[:, None]
                                   & batch.attention_mask, batch.logp_rollout, 0.0))


def test_packed_logprobs_and_values_equal_padded_rows():
    """Per-token logprobs, entropies (chunked, chunks straddling trajectories) and values."""
    trainer = make_trainer(max_tokens_per_microbatch=BUDGET, sampling=SamplingConfig(temperature=0.7))
    torch.nn.init.normal_(trainer.critic.value_head.weight, std=0.1)  # V != 0 (a fresh head is 0 everywhere)
    batch = build_batch(synthetic_trajectories(10, seed=1))
    ref_logp, ref_entropy = policy_token_logprobs(trainer.policy, batch.input_ids, batch.attention_mask,
                                                  batch.action_mask, 0.7, chunk_size=5)
    ref_values = torch.where(batch.attention_mask, trainer.critic(batch.input_ids, batch.attention_mask), 0.0)
    logp, entropy, leaky = (torch.zeros(batch.input_ids.shape) for _ in range(3))
    groups = micro_batches(batch, BUDGET)
    assert max(len(g) for g in groups) > 1
    for rows in groups:
        mb = pack(batch, rows)
        lp, ent = policy_token_logprobs(trainer.policy, mb.input_ids, None, mb.action_mask, 0.7, chunk_size=5,
                                        position_ids=mb.position_ids)
        mb.scatter(lp, logp)
        mb.scatter(ent, entropy)
        one_sequence = torch.arange(mb.num_tokens)[None]  # the sabotage: no reset, attention leaks across rows
        mb.scatter(policy_token_logprobs(trainer.policy, mb.input_ids, None, mb.action_mask, 0.7,
                                         position_ids=one_sequence)[0], leaky)
    with torch.no_grad():
        values = trainer.compute_values(batch, groups)
    mask = batch.action_mask
    torch.testing.assert_close(logp[mask], ref_logp[mask].detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy[mask], ref_entropy[mask].detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(values, ref_values.detach(), rtol=1e-5, atol=1e-5)
    assert (leaky[mask] - ref_logp[mask]).abs().max() > 1e-2


@pytest.mark.parametrize("policy_loss_name", ["dis", "ppo"])
def test_packed_update_gives_the_padded_losses_and_gradients(policy_loss_name):
    """The trainer's packed micro-batch passes vs one padded pass over the whole batch: the policy's
    summed loss and gradients (DIS, and PPO with value clipping), the critic's value loss and gradients."""
    extra = {"importance": "tis", "value_clip": 0.2} if policy_loss_name == "ppo" else {}
    trainer = make_trainer(max_tokens_per_microbatch=BUDGET, max_grad_norm=1e9, critic_steps=1,
                           policy_loss=policy_loss_name,
                           **extra)
    cfg = trainer.config
    torch.nn.init.normal_(trainer.critic.value_head.weight, std=0.1)  # a zero head would pass the backbone no gradient
    batch = build_batch(synthetic_trajectories(10, seed=2))
    groups = micro_batches(batch, BUDGET)
    values = trainer.compute_values(batch, groups)
    _, advantages, returns = training_advantages(batch, values, cfg)
    trained = value_mask(batch, cfg)
    policy_ref, critic_ref = copy.deepcopy(trainer.policy), copy.deepcopy(trainer.critic)

    trainer._critic_steps(batch, groups, returns, values, trained)  # one step, unclipped (max_grad_norm)
    trainer._optimizer_step(batch, groups, advantages, None)

    ref_v = critic_ref(batch.input_ids, batch.attention_mask)
    ref_vloss = value_loss(ref_v, returns, trained, values, clip=cfg.value_clip, normalizer=int(trained.sum()))
    ref_vloss.backward()
    logp, _ = policy_token_logprobs(policy_ref, batch.input_ids, batch.attention_mask, batch.action_mask)
    ref_loss, _ = policy_loss(logp, batch.logp_rollout, advantages, batch.action_mask, cfg,
                              normalizer=int(batch.action_mask.sum()))
    ref_loss.backward()

    packed_loss = 0.0  # the trainer's summed loss, from its packed passes after the step: recompute before it
    for rows in groups:
        mb = pack(batch, rows)
        lp, _ = policy_token_logprobs(policy_ref, mb.input_ids, None, mb.action_mask, position_ids=mb.position_ids)
        packed_loss += policy_loss(lp, mb.logp_rollout, mb.gather(advantages), mb.action_mask, cfg,
                                   normalizer=int(batch.action_mask.sum()))[0].item()
    assert packed_loss == pytest.approx(ref_loss.item(), rel=1e-5, abs=1e-7)
    for model, ref in ((trainer.policy, policy_ref), (trainer.critic, critic_ref)):
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        ref_grads = {n: p.grad for n, p in ref.named_parameters() if p.grad is not None}
        assert grads.keys() == ref_grads.keys() and grads
        errors = {n: relative_error(grads[n], ref_grads[n]) for n in grads if ref_grads[n].norm() > 0}
        print(type(model).__name__, "max relative gradient error", max(errors.values()), "over", len(errors))
        assert len(errors) > 2 and max(errors.values()) <= 1e-5, max(errors.items(), key=lambda kv: kv[1])


@pytest.mark.parametrize("attn", ["sdpa", "eager", PACKED_SDPA])
@pytest.mark.parametrize("family", ["Qwen2", "Qwen3", "Llama"])
def test_other_families_keep_attention_inside_each_packed_trajectory(family, attn):
    """The dense families too: transformers' create_causal_mask reads packed position ids (sdpa, eager);
    PACKED_SDPA (what SAOTrainer runs on an sdpa model) runs SDPA per trajectory."""
    import transformers  # lazy: the model classes by family name

    torch.manual_seed(0)
    config = getattr(transformers, f"{family}Config")(vocab_size=512, hidden_size=32, intermediate_size=64,
                                                     num_hidden_layers=2, num_attention_heads=4,
                                                     num_key_value_heads=2, head_dim=8)
    model = getattr(transformers, f"{family}ForCausalLM")(config)
    model.set_attn_implementation(attn) if attn != PACKED_SDPA else use_packed_sdpa(model)
    assert model.config._attn_implementation == attn
    batch = build_batch(synthetic_trajectories(6, seed=4))
    with torch.no_grad():
        ref, _ = policy_token_logprobs(model, batch.input_ids, batch.attention_mask, batch.action_mask)
        logp = torch.zeros_like(ref)
        for rows in micro_batches(batch, BUDGET):
            mb = pack(batch, rows)
            mb.scatter(policy_token_logprobs(model, mb.input_ids, None, mb.action_mask,
                                             position_ids=mb.position_ids)[0], logp)
    torch.testing.assert_close(logp, ref, rtol=1e-5, atol=1e-5)


def test_an_action_at_a_trajectory_start_inside_a_pack_is_rejected():
    trainer = make_trainer()
    torch.nn.init.normal_(trainer.critic.value_head.weight, std=0.1)
    torch.nn.init.normal_(trainer.critic.value_head.bias, std=0.1)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    positions = torch.tensor([[0, 1, 2, 0, 1]])  # two trajectories; the second starts with an action
    actions = torch.tensor([[False, True, True, True, False]])
    with pytest.raises(ValueError, match="position 0 of a sequence"):
        policy_token_logprobs(trainer.policy, ids, None, actions, position_ids=positions)
    with pytest.raises(ValueError, match="attention_mask"):
        trainer.critic(ids, torch.ones_like(ids, dtype=torch.bool), position_ids=positions)
    values = trainer.critic(ids, position_ids=positions)[0]
    assert values[[0, 3]].tolist() == [0.0, 0.0] and (values[[1, 2, 4]] != 0).all()  # starts have no predictor


def _trajectory(task: str, n: int, i: int) -> Trajectory:
    return Trajectory(task_id=task, traj_id=f"{task}-{i}", reward=1.0, segments=[Segment("observation", [1] * n)])


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_split_balances_tokens_within_one_unit(world_size):
    rng = random.Random(world_size)
    kept = [_trajectory(f"t{i % 5}", int(rng.lognormvariate(5, 1)) + 1, i) for i in range(23)]
    kept.sort(key=lambda t: -t.num_tokens)  # the old contiguous count split puts the long ones on rank 0
    for by_task in (False, True):
        parts = split(kept, world_size, by_task=by_task)
        assert sorted(t.traj_id for p in parts for t in p) == sorted(t.traj_id for t in kept)
        assert all([kept.index(t) for t in p] == sorted(kept.index(t) for t in p) for p in parts)  # batch order
        units = {}
        for t in kept:
            units.setdefault(t.task_id if by_task else t.traj_id, []).append(t.num_tokens)
        if by_task:  # a task's group is never cut
            assert all(len({p_i for p_i, p in enumerate(parts) for t in p if t.task_id == task}) == 1
                       for task in units)
        loads = [sum(t.num_tokens for t in p) for p in parts]
        assert max(loads) - min(loads) <= max(sum(u) for u in units.values()), (loads, by_task)
        assert split(kept, world_size, by_task) == parts
    count_split = [kept[r * len(kept) // world_size:(r + 1) * len(kept) // world_size] for r in range(world_size)]
    count_loads = [sum(t.num_tokens for t in p) for p in count_split]
    assert max(count_loads) - min(count_loads) > max(t.num_tokens for t in kept)  # what balancing fixes


def test_the_old_key_loads_with_a_deprecation_naming_the_new_one():
    with pytest.warns(FutureWarning, match="use trainer.max_tokens_per_microbatch"):
        cfg = TrainerConfig(micro_batch_tokens=96)
    assert cfg.max_tokens_per_microbatch == 96
    with pytest.raises(ValueError, match="keep only max_tokens_per_microbatch"):
        TrainerConfig(micro_batch_tokens=96, max_tokens_per_microbatch=64)
