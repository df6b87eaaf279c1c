"""`sao sft` and `sao value-pretrain` on 2 FSDP2 ranks (gloo on CPU, runtime.world_size=2) against one
process, on the tiny Qwen3-MoE (harness.tiny_model).

SFT: the ranks' weights after the steps against a plain-torch loop of the same math (whole-sequence
forwards, cross-entropy over the action tokens / the step's action tokens, transformers' linear
schedule), with uneven examples so that the ranks hold different action-token counts, several
micro-batches (max_tokens_per_microbatch=40) and an epoch's short last step; the per-rank mean is the
power check. The written model directory against the ranks' weights, and the stage end to end.
Value pretraining: the stage on 2 ranks against pretrain_critic in this process.
"""
from __future__ import annotations

import json
import random

import pytest
import torch

from sao_harness.harness.store import TraceStore
from sao_harness.harness.trace import Segment, Status, Trajectory
from sao_harness.trainer.config import SFTConfig, TrainerConfig
from sao_harness.trainer.dist import distributed
from sao_harness.trainer.report.metrics import family, read_metrics
from sao_harness.trainer.warm import sft_dist
from tests.support.trainer_data import synthetic_trajectories

pytestmark = pytest.mark.slow
SFT = SFTConfig(lr=1e-3, batch_size=2, grad_accum=2, epochs=2.0)  # 10 examples: steps of 4, 4, 2 per epoch
TRAINER = TrainerConfig(max_tokens_per_microbatch=40, logprob_chunk=16)


def examples(n: int = 10, seed: int = 0) -> list[dict]:
    """SFT rows of 1-3 turns, uneven observation and action lengths (vocab of the tiny model)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ids, mask = [], []
        for _ in range(rng.randint(1, 3)):
            for is_action, k in ((0, rng.randint(2, 14)), (1, rng.randint(1, 10))):
                ids += [rng.randrange(300, 4000) for _ in range(k)]
                mask += [is_action] * k
        out.append({"input_ids": ids, "assistant_masks": mask, "traj_id": f"t{i}"})
    return out


def reference_sft(model_dir, exs: list[dict], sft: SFTConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """The same steps in one process, plain torch: per step, sum of the action tokens' cross-entropy over
    its examples / their action tokens (the first token is never predicted), clip 1.0, AdamW, lr from
    transformers' linear schedule (TRL's)."""
    from transformers import AutoModelForCausalLM, get_constant_schedule, get_linear_schedule_with_warmup

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=sft.lr, weight_decay=0.0)
    total = sft_dist.total_steps(len(exs), sft)
    schedule = (get_linear_schedule_with_warmup(optimizer, 0, total) if sft.lr_schedule == "linear"
                else get_constant_schedule(optimizer))
    batches = sft_dist.step_batches(len(exs), sft.batch_size * sft.grad_accum, seed)
    for _ in range(total):
        _, rows = next(batches)
        optimizer.zero_grad()
        nll, n = 0.0, 0
        for i in rows:
            ids = torch.tensor(exs[i]["input_ids"])
            predicted = torch.tensor(exs[i]["assistant_masks"][1:], dtype=torch.bool)
            logits = model(input_ids=ids[None]).logits[0, :-1]
            nll = nll + torch.nn.functional.cross_entropy(logits[predicted], ids[1:][predicted], reduction="sum")
            n += int(predicted.sum())
        (nll / n).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), sft_dist.MAX_GRAD_NORM)
        optimizer.step()
        schedule.step()
    return model.state_dict()


def max_relative_error(a: dict, b: dict) -> float:
    """max over tensors of ||a - b|| / ||b||."""
    assert a.keys() == b.keys()
    return max(((a[k].float() - b[k].float()).norm() / b[k].float().norm().clamp_min(1e-12)).item() for k in b)


def _sft_ranks(rank, world_size, address, second_port, model_dir, exs, out):
    """Both runs in the same two processes: the right one (its weights, its model directory), then the
    per-rank mean (each rank divides by its own action tokens; FSDP still sums the gradients)."""
    def one(addr, per_rank_mean):
        dp = distributed.DataParallel(rank, world_size, addr)
        if per_rank_mean:
            dp.sum = lambda x: x
        policy = sft_dist.build(str(model_dir), dp, "float32", SFT, TRAINER)
        history = sft_dist.train(policy, dp, exs, SFT, TRAINER, "float32")
        weights = distributed.full_state_dict(policy, "lm.")
        if not per_rank_mean:
            sft_dist.write_model(out, policy, str(model_dir), rank)
        dp.close()
        return {"weights": weights, "history": history}

    right = one(address, False)
    wrong = one((address[0], second_port), True)
    return {"right": right, "wrong": wrong} if rank == 0 else None


@pytest.fixture(scope="module")
def sft_runs(tiny_model_dir, tmp_path_factory):
    exs = examples()
    out = tmp_path_factory.mktemp("sft") / "model"
    runs = distributed.spawn(2, _sft_ranks, distributed.free_port(), tiny_model_dir, exs, out)[0]
    return runs | {"ref": reference_sft(tiny_model_dir, exs, SFT), "out": out, "examples": exs}


def test_two_ranks_give_the_single_process_sft_steps(sft_runs, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    ref, right = sft_runs["ref"], sft_runs["right"]
    err = max_relative_error(right["weights"], ref)
    print("relative error of 2 ranks vs one process:", err)
    assert err <= 1e-5
    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    assert max_relative_error(start, ref) > 1e-3  # the steps moved the weights well beyond the tolerance
    history = right["history"]
    assert [h["step"] for h in history] == list(range(1, 7))
    assert [h["learning_rate"] for h in history] == pytest.approx([1e-3 * (6 - t) / 6 for t in range(6)])
    assert history[-1]["epoch"] == pytest.approx(2.0)
    lengths = sum(len(e["input_ids"]) for e in sft_runs["examples"])
    assert history[-1]["num_tokens"] == 2 * lengths  # every example twice, each counted once over the ranks


def test_power_a_per_rank_mean_fails_the_check(sft_runs):
    err = max_relative_error(sft_runs["wrong"]["weights"], sft_runs["ref"])
    print("relative error of the per-rank mean:", err)
    assert err > 1e-3


def test_the_written_model_directory_is_the_ranks_weights(sft_runs, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = sft_runs["out"]
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    written = model.state_dict()
    assert written.keys() == sft_runs["right"]["weights"].keys()
    for name, tensor in sft_runs["right"]["weights"].items():
        assert torch.equal(written[name], tensor), name
    assert json.loads((out / "config.json").read_text()) == json.loads((tiny_model_dir / "config.json").read_text())
    assert AutoTokenizer.from_pretrained(out).get_vocab() == AutoTokenizer.from_pretrained(tiny_model_dir).get_vocab()


# --- the stages, end to end ---------------------------------------------------------------------

def make_cfg(tmp_path, *overrides):
    from sao_harness.sao.config import load_config

    return load_config(None, [f"run.root={tmp_path}", "run.name=r", "runtime.world_size=2", *overrides])


def sft_trajectory(i: int) -> Trajectory:
    rng = random.Random(i)
    segments = []
    for _ in range(rng.randint(1, 3)):
        segments.append(Segment("observation", [rng.randrange(300, 4000) for _ in range(rng.randint(3, 12))]))
        k = rng.randint(2, 9)
        segments.append(Segment("action", [rng.randrange(300, 4000) for _ in range(k)], [-8.3] * k, [0] * k))
    return Trajectory(task_id=f"task{i}", segments=segments, status=Status.OK, reward=1.0, turns=len(segments) // 2)


def test_sao_sft_on_two_ranks_writes_what_one_process_writes(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from sao_harness.trainer.warm.sft import load_sft_corpus, run_sft, to_examples

    trajs = [sft_trajectory(i) for i in range(6)]
    TraceStore(tmp_path / "r").write(trajs)
    cfg = make_cfg(tmp_path, f"model.path={tiny_model_dir}", "sft.lr=1e-3", "sft.max_steps=3", "sft.batch_size=2",
                   "sft.lr_schedule=constant", "trainer.max_tokens_per_microbatch=40")
    result = run_sft(cfg, verbose=False)
    out = tmp_path / "r" / "sft"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == result.steps == 3 and summary["examples"] == 6
    records = read_metrics(out)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(family(k) for r in records for k in r if k not in ("step", "time"))
    assert [r["loss/sft_loss"] for r in records] == pytest.approx([h["loss"] for h in result.history])
    model_dir = out / "model"
    assert json.loads((model_dir / "config.json").read_text()) == \
        json.loads((tiny_model_dir / "config.json").read_text())
    trained = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    exs = to_examples(load_sft_corpus([tmp_path / "r"]).trajectories)  # in the stage's order
    ref = reference_sft(tiny_model_dir, exs, cfg.sft, seed=cfg.run.seed)
    assert max_relative_error(trained, ref) <= 1e-5


def test_sao_sft_on_ranks_refuses_the_moe_load_balancing_loss(tmp_path, tiny_model_dir):
    from sao_harness.core.errors import UserError
    from sao_harness.trainer.warm.sft import run_sft

    TraceStore(tmp_path / "r").write([sft_trajectory(0), sft_trajectory(1)])
    cfg = make_cfg(tmp_path, f"model.path={tiny_model_dir}", "sft.router_aux_loss_coef=0.01")
    with pytest.raises(UserError, match="router_aux_loss_coef"):
        run_sft(cfg, verbose=False)


def test_value_pretraining_on_two_ranks_is_pretrain_critic_in_one_process(tmp_path, tiny_model_dir):
    from sao_harness.trainer.modeling.critic_init import freeze_critic, load_backbone_critic
    from sao_harness.trainer.modeling.models import load_critic
    from sao_harness.trainer.warm.value_pretrain import load_corpus, pretrain_critic, run_value_pretrain

    TraceStore(tmp_path / "r").write(synthetic_trajectories(12, seed=3))
    cfg = make_cfg(tmp_path, f"model.path={tiny_model_dir}", "value_pretrain.lr=2e-3", "value_pretrain.max_steps=5",
                   "value_pretrain.batch_size=5", "value_pretrain.patience=1000",
                   "value_pretrain.eval_trajectories=7", "trainer.max_tokens_per_microbatch=30")
    result = run_value_pretrain(cfg, verbose=False)

    corpus = load_corpus([tmp_path / "r"])
    critic = load_backbone_critic(str(tiny_model_dir))
    freeze_critic(critic, cfg.trainer)
    start = {k: v.clone() for k, v in critic.state_dict().items()}
    ref = pretrain_critic(critic, corpus.trajectories, cfg.value_pretrain, cfg.trainer, seed=cfg.run.seed,
                          pad_token_id=critic.backbone.config.pad_token_id or 0, verbose=False)
    ranks = load_critic(result.checkpoint).state_dict()
    err = max_relative_error(ranks, critic.state_dict())
    print("relative error of 2 ranks vs one process:", err)
    assert err <= 1e-5
    assert max_relative_error(start, critic.state_dict()) > 1e-3
    assert (result.steps, result.stop_reason) == (ref.steps, ref.stop_reason) == (5, "budget")
    for key in ("value_loss", "explained_variance"):
        assert result.before[key] == pytest.approx(ref.before[key], rel=1e-5, abs=1e-7)
        assert result.after[key] == pytest.approx(ref.after[key], rel=1e-5, abs=1e-7)
    for mine, theirs in zip(result.history, ref.history):
        for key in ("loss/value_loss", "critic/explained_variance", "critic/grad_norm", "rollout/action_tokens",
                    "critic/return_mean"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-5, abs=1e-7), key
    out = tmp_path / "r" / "value_pretrain"
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3, 4, 5]
    assert json.loads((out / "summary.json").read_text())["steps"] == 5
