"""`sao sft` on the tiny model with synthetic trajectories (no Docker): selection, action-only labels,
the loss falling, and the written model directory loading and serving."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from sao_harness.core.errors import UserError
from sao_harness.harness.store import TraceStore
from sao_harness.harness.trace import Segment, Status, Trajectory
from sao_harness.trainer.config import SFTConfig
from sao_harness.trainer.report.metrics import family
from sao_harness.trainer.warm.sft import build_trainer, fit_max_length, load_sft_corpus, to_examples

ROOT = Path(__file__).resolve().parents[2]

LOGP = -8.3
ACTION = [200 + i for i in range(12)]  # every action is this run of tokens: learnable in a few steps


def traj(i, status=Status.OK, reward=1.0, turns=2, breaks=()):
    rng = random.Random(i)
    segments = []
    for _ in range(turns):
        segments.append(Segment("observation", [rng.randrange(300, 4000) for _ in range(rng.randint(4, 9))]))
        segments.append(Segment("action", list(ACTION), [LOGP] * len(ACTION), [0] * len(ACTION)))
    return Trajectory(task_id=f"task{i}", segments=segments, status=status, reward=reward, turns=turns,
                      breaks=list(breaks))


def cfg_for(tmp_path, *overrides):
    from sao_harness.sao.config import load_config
    return load_config(None, [f"run.root={tmp_path}", "run.name=r", f"model.cache_dir={ROOT / '.cache' / 'sao'}",
                              *overrides])


def test_select_keeps_resolved_by_default(tmp_path):
    resolved = [traj(0), traj(1)]
    others = [traj(2, reward=0.0), traj(3, status=Status.TRUNCATED_TURNS, reward=1.0), traj(4, reward=0.5),
              traj(5, status=Status.INFRA_ERROR, reward=None)]
    TraceStore(tmp_path / "a").write(resolved[:1] + others[:2])
    TraceStore(tmp_path / "b" / "traces").write(resolved[1:] + others[2:])
    stores = [tmp_path / "a", tmp_path / "b" / "traces", tmp_path / "a"]  # a store listed twice counts once
    c = load_sft_corpus(stores)
    assert {t.traj_id for t in c.trajectories} == {t.traj_id for t in resolved}
    assert c.counts == dict(read=9, used=2, not_selected=4, no_action=0, duplicate=3)
    assert load_sft_corpus(stores, "positive").counts["used"] == 4  # + truncated with reward 1, reward 0.5
    assert load_sft_corpus(stores, "all").counts["used"] == 6


def test_labels_are_minus_100_exactly_at_observation_tokens(tiny_model_dir, tmp_path):
    trajs = [traj(0), traj(1, turns=3), traj(2, breaks=[5])]
    examples = to_examples(trajs)
    assert len(examples) == 4  # the trajectory with a break is two sequences
    trainer = build_trainer(str(tiny_model_dir), examples, SFTConfig(max_steps=1), tmp_path / "trl")
    ds = trainer.train_dataset
    assert len(ds) == len(examples) and trainer.args.max_length == max(len(e["input_ids"]) for e in examples)
    batch = trainer.data_collator([ds[i] for i in range(len(ds))])
    by_ids = {tuple(e["input_ids"]): e["assistant_masks"] for e in examples}
    for ids, labels, att in zip(batch["input_ids"].tolist(), batch["labels"].tolist(),
                                batch["attention_mask"].tolist()):
        n = sum(att)
        mask = by_ids[tuple(ids[:n])]
        assert labels[:n] == [t if a else -100 for t, a in zip(ids[:n], mask)]
        assert labels[n:] == [-100] * (len(ids) - n)  # padding


def test_max_length_comes_from_the_data_and_never_cuts_all_actions():
    examples = to_examples([traj(0), traj(1)])
    longest = max(len(e["input_ids"]) for e in examples)
    assert fit_max_length(examples, None) == (longest, 0)
    first_action = examples[0]["assistant_masks"].index(1)
    assert fit_max_length(examples, first_action + 1)[1] == 2  # truncated, but an action token is kept
    with pytest.raises(UserError, match="cuts every action token"):
        fit_max_length(examples, first_action)
    with pytest.raises(UserError, match="max_position_embeddings"):
        fit_max_length(examples, None, model_max=longest - 1)


@pytest.mark.slow
def test_sao_sft_trains_action_tokens_and_writes_a_servable_model(tiny_model_dir, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sao_harness.harness.engines import SamplingParams, make_engine
    from sao_harness.sao.cli import main

    store = tmp_path / "r"
    TraceStore(store).write([traj(i) for i in range(4)] + [traj(9, reward=0.0)])
    assert main(["sft", "sft.lr=3e-3", "sft.max_steps=8", "sft.batch_size=2", f"run.root={tmp_path}", "run.name=r",
                 f"model.cache_dir={ROOT / '.cache' / 'sao'}"]) == 0
    out = capsys.readouterr().out
    assert "4 of 5 trajectories" in out and "step 8/8" in out
    model_dir = store / "sft" / "model"
    assert f"model written to {model_dir.resolve()}" in out.splitlines()[-1]
    summary = json.loads((store / "sft" / "summary.json").read_text())
    assert summary["steps"] == 8 and summary["loss_last"] < summary["loss_first"] - 1.0, summary
    records = [json.loads(line) for line in (store / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert all(family(k) for r in records for k in r if k not in ("step", "time")), records[0]
    losses = [r["loss/sft_loss"] for r in records]
    assert len(losses) == 8 and losses[-1] == summary["loss_last"]

    # the saved config is the input model's (no router logits / aux loss switched on, same dtype)
    def config(d):
        return json.loads((d / "config.json").read_text())

    assert config(model_dir) == config(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    vocab = AutoTokenizer.from_pretrained(tiny_model_dir).get_vocab()
    assert AutoTokenizer.from_pretrained(model_dir).get_vocab() == vocab
    assert not model.config.output_router_logits

    engine = make_engine(cfg_for(tmp_path, f"model.path={model_dir}", "engine.kind=hf"))
    try:
        prompt = traj(0).segments[0].token_ids + ACTION[:1]  # an observation, then the action's first token
        res = engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=6))
    finally:
        engine.close()
    assert res.token_ids == ACTION[1:7]  # it learned the action tokens (greedy)
