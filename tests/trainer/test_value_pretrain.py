"""Value pretraining on the tiny model with a synthetic corpus, and the RL critic warm-up options.

Corpus: reward 1 iff the trajectory's first action starts with MARKER, else 0, so the return depends
on the tokens and a critic can learn it.
"""
from __future__ import annotations

import argparse
import copy
import random
import re
from pathlib import Path

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from sao_harness.core.errors import UserError
from sao_harness.harness.store import TraceStore
from sao_harness.harness.trace import Segment, Status, Trajectory
from sao_harness.trainer.algo.batch import build_batch
from sao_harness.trainer.config import TrainerConfig, ValuePretrainConfig
from sao_harness.trainer.modeling.critic_init import initial_critic
from sao_harness.trainer.modeling.models import Critic, load_critic
from sao_harness.trainer.report.metrics import family, read_metrics
from sao_harness.trainer.warm.value_pretrain import (
    cmd_value_pretrain,
    load_corpus,
    monte_carlo_returns,
    pretrain_critic,
    run_value_pretrain,
)

ROOT = Path(__file__).resolve().parents[2]

MARKER = 77
LOGP = -8.3  # ~ log(1 / 4096): a uniform tiny model, ratio ~ 1 on-policy


def corpus(n, seed=0, version=0):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        hit = i % 2 == 0
        segments = []
        for turn in range(rng.randint(1, 2)):
            segments.append(Segment("observation", [rng.randrange(100, 4000) for _ in range(rng.randint(3, 8))]))
            k = rng.randint(3, 8)
            tokens = [rng.randrange(100, 4000) for _ in range(k)]
            if hit and turn == 0:
                tokens[0] = MARKER
            segments.append(Segment("action", tokens, [LOGP] * k, [version] * k))
        out.append(Trajectory(task_id=f"task{i % 4}", segments=segments, reward=float(hit), turns=len(segments) // 2))
    return out


def make_cfg(tmp_path, *overrides):
    from sao_harness.sao.config import load_config
    return load_config(None, [f"run.root={tmp_path}", "run.name=r", f"model.cache_dir={ROOT / '.cache' / 'sao'}",
                              *overrides])


# --- returns and corpus -------------------------------------------------------------------------

def test_monte_carlo_returns_are_the_reward_at_every_action_token():
    trajs = corpus(6, seed=3)
    trajs[1].reward = 0.7
    batch = build_batch(trajs)
    returns = monte_carlo_returns(batch)
    for row, t in enumerate(trajs):
        mask = batch.action_mask[row]
        assert torch.equal(returns[row][mask], torch.full((int(mask.sum()),), float(t.reward)))
        assert (returns[row][~mask] == 0).all()
    # gamma < 1: discounted from the last action token, observations skipped (not discounted through)
    g = monte_carlo_returns(batch, gamma=0.9)[1][batch.action_mask[1]]
    k = g.numel()
    torch.testing.assert_close(g, torch.tensor([0.7 * 0.9 ** (k - 1 - i) for i in range(k)]))


def test_load_corpus_from_several_stores_skips_and_counts(tmp_path):
    good = corpus(6)
    infra = Trajectory(task_id="t", status=Status.INFRA_ERROR, reward=None,
                       segments=[Segment("observation", [5, 6]), Segment("action", [7], [LOGP], [0])])
    broken = corpus(1, seed=9)[0]
    broken.breaks = [2]
    no_action = Trajectory(task_id="t", reward=1.0, segments=[Segment("observation", [5, 6])])
    later = corpus(1, seed=5, version=3)[0]
    TraceStore(tmp_path / "a").write(good[:3] + [infra, broken])
    TraceStore(tmp_path / "b").write(good[3:] + [no_action, later])
    c = load_corpus([tmp_path / "a", tmp_path / "b" / "traces", tmp_path / "a"])
    assert {t.traj_id for t in c.trajectories} == {t.traj_id for t in good + [later]}
    assert c.counts == dict(read=15, used=7, unrewarded=1, breaks=1, no_action=1, action_first=0, duplicate=5,
                            later_policy=1)
    with pytest.raises(UserError, match="value_pretrain.traces: trace path not found"):
        load_corpus([tmp_path / "nope"])


# --- the stage ----------------------------------------------------------------------------------

def test_value_pretraining_fits_the_corpus_and_writes_a_loadable_checkpoint(tmp_path, tiny_model_dir, capsys):
    trajs = corpus(32)
    TraceStore(tmp_path / "r").write(trajs[:16])  # the run's own store ...
    TraceStore(tmp_path / "more").write(trajs[16:])  # ... and a second one: a larger corpus
    cfg = make_cfg(tmp_path, f"value_pretrain.traces=[{tmp_path / 'r'}, {tmp_path / 'more'}]",
                   "value_pretrain.lr=2e-3", "value_pretrain.max_steps=20", "value_pretrain.patience=1000",
                   "value_pretrain.eval_trajectories=32")
    result = run_value_pretrain(cfg)
    out = capsys.readouterr().out

    assert result.corpus["used"] == 32 and result.steps == 20 and result.stop_reason == "budget"
    tokens = [(t.num_action_tokens, t.reward) for t in trajs]
    untrained = 0.5 * sum(n * r ** 2 for n, r in tokens) / sum(n for n, _ in tokens)  # V = 0: 0.5 mean(G^2)
    assert result.before["value_loss"] == pytest.approx(untrained, rel=1e-5)
    assert result.before["explained_variance"] == pytest.approx(0.0, abs=1e-6)
    assert result.after["value_loss"] < 0.25 * result.before["value_loss"]
    assert result.after["explained_variance"] > 0.5
    losses = [h["loss/value_loss"] for h in result.history]
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5

    run = tmp_path / "r"
    records = read_metrics(run / "value_pretrain")
    assert [r["step"] for r in records] == list(range(1, 21))
    assert all({"loss/value_loss", "critic/explained_variance", "critic/grad_norm"} <= r.keys() for r in records)
    assert all(family(k) for r in records for k in r if k not in ("step", "time"))
    assert list((run / "value_pretrain" / "tb").glob("events.out.tfevents.*"))
    assert (run / "value_pretrain" / "summary.json").is_file()

    ckpt = run / "value_pretrain" / "critic"
    assert result.checkpoint == str(ckpt.resolve())
    assert f"trainer.value_pretrain_checkpoint={ckpt.resolve()}" in out
    critic = load_critic(ckpt)
    batch = build_batch(trajs[:16])
    with torch.no_grad():
        v = critic(batch.input_ids, batch.attention_mask)
    err = 0.5 * ((v - monte_carlo_returns(batch)) ** 2)[batch.action_mask].mean().item()
    assert err < 0.25 * untrained

    # frozen as configured (trainer.critic_freeze=attention + norms, router, embeddings); experts trained
    fresh = Critic.from_pretrained(str(tiny_model_dir)).state_dict()
    trained = critic.state_dict()
    frozen = [n for n in fresh if re.search(r"self_attn\.|norm\.weight$|mlp\.gate\.weight$|embed_tokens", n)]
    assert any("self_attn" in n for n in frozen)
    for name in frozen:
        assert torch.equal(fresh[name], trained[name]), f"{name} changed but is frozen"
    experts = [n for n in fresh if "experts" in n]
    assert experts and any(not torch.equal(fresh[n], trained[n]) for n in experts)
    assert trained["value_head.weight"].abs().sum() > 0

    # what `sao train` starts from with the printed override
    policy_cfg = make_cfg(tmp_path, f"trainer.value_pretrain_checkpoint={ckpt.resolve()}").trainer
    from transformers import AutoModelForCausalLM
    policy = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    start = initial_critic(policy_cfg, policy)
    assert torch.equal(start.value_head.weight, critic.value_head.weight)
    assert initial_critic(TrainerConfig(), policy).value_head.weight.abs().sum() == 0  # unset: from the policy
    with pytest.raises(UserError, match="directory not found"):
        initial_critic(TrainerConfig(value_pretrain_checkpoint=str(tmp_path / "none")), policy)


@pytest.fixture(scope="module")
def base_critic(tiny_model_dir):
    return Critic.from_pretrained(str(tiny_model_dir))


def test_stops_at_the_plateau(base_critic):
    critic = copy.deepcopy(base_critic)
    vp = ValuePretrainConfig(batch_size=8, lr=1e-3, max_steps=50, patience=3, min_delta=100.0, eval_trajectories=0)
    result = pretrain_critic(critic, corpus(16), vp, TrainerConfig(), verbose=False)
    # step 1 sets the best; no later step can improve by 100, so it stops after `patience` more
    assert result.stop_reason == "plateau" and result.steps == 4
    assert [h["critic/steps_since_improvement"] for h in result.history] == [0, 1, 2, 3]
    assert result.before == {} and result.after == {}


def test_stops_at_the_budget_and_a_small_corpus_is_one_batch(base_critic):
    critic = copy.deepcopy(base_critic)
    vp = ValuePretrainConfig(batch_size=64, lr=1e-3, max_steps=3, patience=100, eval_trajectories=0)
    result = pretrain_critic(critic, corpus(5), vp, TrainerConfig(critic_freeze="none"), verbose=False)
    assert result.stop_reason == "budget" and result.steps == 3
    assert all(h["rollout/trajectories"] == 5 for h in result.history)
    assert all(p.requires_grad for p in critic.parameters())  # critic_freeze=none trains everything


def test_cli_value_pretrain_bad_run_dir_is_a_one_line_error(tmp_path, capsys):
    cfg = make_cfg(tmp_path, "run.name=missing")
    with pytest.raises(UserError) as e:
        cmd_value_pretrain(argparse.Namespace(cfg=cfg))
    assert "\n" not in str(e.value) and str(tmp_path / "missing" / "traces") in str(e.value)

    from sao_harness.sao.cli import build_parser, main
    func = build_parser().parse_args(["value-pretrain"]).func
    if getattr(func, "__name__", "") != "cmd_value_pretrain":
        pytest.skip("`sao value-pretrain` is not wired to trainer.warm.value_pretrain.cmd_value_pretrain yet")
    capsys.readouterr()
    assert main(["value-pretrain", f"run.root={tmp_path}", "run.name=missing"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "trace path not found" in err


# --- the RL critic warm-up options of TrainerConfig (implemented by SAOTrainer) -----------------

@pytest.fixture(scope="module")
def tiny_policy(tiny_model_dir):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))


def make_trainer(policy, **overrides):
    from sao_harness.trainer.algo.sao import SAOTrainer
    policy = copy.deepcopy(policy)
    config = TrainerConfig(**({"lr": 1e-3, "critic_lr": 1e-3, "critic_warmup_steps": 0, "critic_steps": 1,
                               "max_staleness": 100} | overrides))
    return SAOTrainer(policy, Critic.from_policy(policy), config)


def test_critic_only_steps_train_the_critic_and_leave_the_policy_unchanged(tiny_policy):
    trainer = make_trainer(tiny_policy, critic_only_steps=2)
    policy_before = copy.deepcopy(trainer.policy.state_dict())
    critic_before = copy.deepcopy(trainer.critic.state_dict())
    trajs = corpus(6)
    for _ in range(2):
        m = trainer.update(trajs)
        assert m["policy/trained"] == 0.0 and "loss/policy_loss" not in m
    assert trainer.policy_version == 0 and trainer.policy_optimizer_steps == 0
    assert trainer.critic_optimizer_steps == 2
    assert all(torch.equal(v, trainer.policy.state_dict()[k]) for k, v in policy_before.items())
    assert any(not torch.equal(v, trainer.critic.state_dict()[k]) for k, v in critic_before.items())
    m = trainer.update(trajs)  # the first policy step comes after critic_only_steps updates
    assert m["policy/trained"] == 1.0 and trainer.policy_version == 1
    assert any(not torch.equal(v, trainer.policy.state_dict()[k]) for k, v in policy_before.items())


def test_critic_lr_warms_up_linearly(tiny_policy):
    trainer = make_trainer(tiny_policy, critic_warmup_steps=4, critic_steps=2, critic_lr=1e-3)
    seen = []
    real_step = trainer.critic_optimizer.step

    def step(*args, **kwargs):
        seen.append(trainer.critic_optimizer.param_groups[0]["lr"])
        return real_step(*args, **kwargs)
    trainer.critic_optimizer.step = step
    trajs = corpus(4)
    logged = [trainer.update(trajs)["critic/lr"] for _ in range(3)]
    # lr_n = critic_lr * min(1, n / warmup) at critic optimizer step n = 1, 2, ... (K = 2 per update)
    assert seen == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])
    assert logged == pytest.approx([5e-4, 1e-3, 1e-3])


def test_policy_lr_warms_up_linearly_and_holds_after(tiny_policy):
    """trainer.lr_warmup_steps: lr_n = lr * min(1, n / N) at policy optimizer step n = 1, 2, ...; a fresh
    Adam's first steps move every weight by about lr whatever the gradient's size, so a large lr needs it."""
    trainer = make_trainer(tiny_policy, lr_warmup_steps=3, lr=3e-4)
    seen = []
    real_step = trainer.policy_optimizer.step

    def step(*args, **kwargs):
        seen.append(trainer.policy_optimizer.param_groups[0]["lr"])
        return real_step(*args, **kwargs)
    trainer.policy_optimizer.step = step
    trajs = corpus(4)
    logged = [trainer.update(trajs)["policy/lr"] for _ in range(5)]
    assert seen == pytest.approx([1e-4, 2e-4, 3e-4, 3e-4, 3e-4])
    assert logged == seen
    assert make_trainer(tiny_policy, lr=3e-4).update(trajs)["policy/lr"] == pytest.approx(3e-4)  # 0 = off


# --- precision: fp32 master weights, autocast, train mode (as SAOTrainer, trainer.modeling.precision) ------

def _bf16_critic(tiny_model_dir) -> Critic:
    """The critic as `sao value-pretrain` loads it in model.dtype=bfloat16, with a nonzero value head
    (so the backbone gets a gradient in the first step too)."""
    critic = Critic.from_pretrained(str(tiny_model_dir), dtype=torch.bfloat16)
    torch.nn.init.normal_(critic.value_head.weight, std=0.1, generator=torch.Generator().manual_seed(0))
    return critic


def _one_step_moved_fraction(critic: Critic, lr: float = 1e-6) -> float:
    """One pretraining step at `lr`: the fraction of trainable elements with a nonzero gradient that moved."""
    from sao_harness.trainer.warm import value_pretrain
    before = {n: p.detach().float().clone() for n, p in critic.named_parameters()}
    seen = {}

    def spy(module, args, output):
        seen.update(training=module.training, dtype=output.dtype)
    handle = critic.backbone.layers[0].self_attn.q_proj.register_forward_hook(spy)
    vp = ValuePretrainConfig(batch_size=8, lr=lr, max_steps=1, patience=100, eval_trajectories=0)
    grads = {}

    def before_step(optimizer, args, kwargs):  # the gradients the step sees
        grads.update({n: p.grad.clone() for n, p in critic.named_parameters() if p.grad is not None})
    step_hook = register_optimizer_step_pre_hook(before_step)
    try:
        value_pretrain.pretrain_critic(critic, corpus(8), vp, TrainerConfig(), verbose=False)
    finally:
        step_hook.remove()
        handle.remove()
    assert seen == {"training": True, "dtype": torch.bfloat16}  # train mode, forward under bf16 autocast
    has_grad = torch.cat([(grads[n] != 0).flatten() for n in grads])
    delta = torch.cat([(p.detach().float() - before[n]).abs().flatten() for n, p in critic.named_parameters()
                       if n in grads])
    return (delta[has_grad] > 0).float().mean().item()


def test_bf16_pretraining_step_at_lr_1e6_moves_the_fp32_master_weights(tiny_model_dir):
    critic = _bf16_critic(tiny_model_dir)
    assert _one_step_moved_fraction(critic) >= 0.9
    assert all(p.dtype == torch.float32 for p in critic.parameters())  # the masters (what save_critic writes)


def test_the_same_step_without_master_weights_does_not_move_bf16_weights(tiny_model_dir, monkeypatch):
    """Power: the stage before master weights (a bf16 critic under plain AdamW) fails the test above."""
    from sao_harness.trainer.warm import value_pretrain
    monkeypatch.setattr(value_pretrain, "to_master_weights", lambda module: module)
    critic = _bf16_critic(tiny_model_dir)
    assert _one_step_moved_fraction(critic) < 0.9
