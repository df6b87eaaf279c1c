"""`sao paper`'s statistics and claim rules, on metrics records written the way `sao train` writes them:
the 95% interval against an independent computation, the verdict rules, collapse, adaptation lag,
sample efficiency on the trajectories sampled, and the report's claim lines."""
from __future__ import annotations

import json
import math
import random
import re
import statistics

import pytest

from sao_harness.sao.config import load_config
from sao_harness.sao.paper import Plan, make_plan, run_overrides, torch_threads
from sao_harness.sao.paper_arms import ARMS, CLAIMS
from sao_harness.sao.paper_claims import decide
from sao_harness.sao.paper_report import summary_line, write_report
from sao_harness.sao.paper_stats import (
    CONTRADICTED,
    INCONCLUSIVE,
    REPRODUCED,
    adaptation_lags,
    collapse_step,
    interval,
    reward_at_trajectories,
    verdict,
)

LINE = re.compile(r"^paper: C[1-8] [A-Za-z0-9 .-]+: (reproduced|contradicted|inconclusive) \(.+\)( \(quick\))?$")


def records(rewards, **extra) -> list[dict]:
    """metrics.jsonl records of a run with these per-step rewards (16 trajectories a step, 1 s a step)."""
    return [{"step": i + 1, "time": float(i), "policy/trained": 1.0, "rollout/reward_mean": r,
             "rollout/trajectories": 16.0, "critic/explained_variance": 0.5, "critic/grad_norm": 1.0,
             "policy/dis_masked": 0.01, "perf/engine_idle_frac": 0.1, **extra} for i, r in enumerate(rewards)]


def test_the_interval_is_the_t_interval_over_seeds():
    xs = [0.61, 0.72, 0.55, 0.70]
    iv = interval(xs)
    # independent: the sample standard deviation from `statistics`, t(0.975, 3) = 3.182 from the t table
    assert iv.mean == pytest.approx(statistics.mean(xs))
    assert iv.half == pytest.approx(3.182 * statistics.stdev(xs) / math.sqrt(4), rel=1e-4)
    assert interval([0.5]).n == 1 and math.isnan(interval([0.5]).half)
    assert interval([None, float("nan")]).n == 0


def test_a_verdict_needs_separated_intervals_in_the_papers_direction():
    high, low = interval([0.90, 0.91, 0.92]), interval([0.50, 0.52, 0.51])
    assert verdict(high, low) == REPRODUCED and verdict(low, high) == CONTRADICTED
    assert verdict(low, high, higher_is_better=False) == REPRODUCED
    wide = interval([0.2, 0.95, 0.6])
    assert verdict(high, wide) == INCONCLUSIVE  # overlapping
    assert verdict(interval([0.9]), interval([0.1])) == INCONCLUSIVE  # one seed: no interval


def test_collapse_is_a_drop_below_the_best_moving_average_before_it():
    stable = records([0.3 + 0.01 * i for i in range(60)])
    assert collapse_step(stable, 0.2) is None
    collapsing = records([0.3 + 0.02 * i for i in range(30)] + [0.1] * 30)
    step = collapse_step(collapsing, 0.2)
    assert step is not None and 31 <= step <= 40  # after the fall, once the 10-step mean has dropped 0.2
    noisy = records([0.6 + (0.1 if i % 2 else -0.1) for i in range(60)])
    assert collapse_step(noisy, 0.2) is None  # noise around a level is not a collapse


def test_adaptation_lag_counts_the_steps_to_regain_90_percent():
    rewards = [0.9] * 20 + [0.1] * 3 + [0.9] * 17 + [0.1] * 20  # shifts after step 20 and 40
    lags = adaptation_lags(records(rewards), every=20, window=1)
    assert lags == [4, 20]  # regained 4 steps after the first; never after the second: the steps left


def test_sample_efficiency_is_read_at_the_same_number_of_trajectories():
    r = records([0.1, 0.2, 0.3, 0.4])
    assert reward_at_trajectories(r, 32) == pytest.approx(0.15)  # the first two steps of 16
    assert reward_at_trajectories(r, 1000) == pytest.approx(0.25)


def _runs(good: str, rng: random.Random) -> dict:
    """Synthetic runs where `good` rises to 0.9 and every other arm stays near 0.5."""
    out = {}
    for arm in ARMS:
        out[arm] = []
        for _ in range(3):
            top = 0.9 if arm == good else 0.5
            out[arm].append(records([min(top, 0.4 + 0.02 * i) + rng.uniform(-0.01, 0.01) for i in range(40)]))
    return out


def test_claims_follow_the_runs_and_the_lines_keep_their_format(tmp_path):
    cfg = load_config("configs/paper.yaml", [])
    plan = Plan(quick=True, steps=40, seeds=3, c1_seeds=3, shift_every=13, pretrain_steps=2)
    results = decide(_runs("sao", random.Random(0)), plan, cfg.paper)
    by_id = {r.id: r for r in results}
    assert [r.id for r in results] == [c.id for c in CLAIMS]
    assert by_id["C1"].verdict == by_id["C4"].verdict == by_id["C5"].verdict == REPRODUCED
    flipped = {r.id: r.verdict for r in decide(_runs("grpo", random.Random(0)), plan, cfg.paper)}
    assert flipped["C1"] == CONTRADICTED and flipped["C2"] == CONTRADICTED
    for r in results:
        assert LINE.match(r.line(" (quick)")), r.line(" (quick)")
    line = summary_line(results, plan, 12.3, " (quick)")
    assert re.match(r"^paper: \d of 8 claims reproduced, \d contradicted, \d inconclusive \(3 seeds, 12 min\) "
                    r"\(quick\)$", line), line
    files = write_report(tmp_path, results, _runs("sao", random.Random(0)), plan, cfg.paper, 12.3, [])
    assert all(f.stat().st_size > 0 for f in files)
    facts = json.loads((tmp_path / "paper.json").read_text())
    assert facts["headline"] == line and len(facts["claims"]) == 8


def test_every_arm_is_a_valid_config_and_uses_the_one_learning_rate(tmp_path):
    cfg = load_config("configs/paper.yaml", [])
    plan = make_plan(cfg.paper, quick=True)
    for arm in ARMS:
        over = run_overrides(plan, arm, 1, cfg.paper.lr, tmp_path)
        run_cfg = load_config("configs/paper.yaml", over)
        assert run_cfg.trainer.lr == cfg.paper.lr and run_cfg.trainer.critic_lr == pytest.approx(5 * cfg.paper.lr)
        assert run_cfg.run.seed == 1 and run_cfg.trainer.env == "chain"
        pretrain = run_cfg.trainer.critic_only_steps
        assert run_cfg.trainer.max_steps == plan.steps + pretrain  # the same policy steps for every arm
    online = load_config("configs/paper.yaml", run_overrides(plan, "sao-online", 0, 1e-3, tmp_path))
    assert online.testbed.chain.shift_every == plan.shift_every
    assert len(plan.runs()) == len(ARMS) * plan.seeds
    only = Plan(**{**plan.to_dict(), "claims": ("C4",)})
    assert only.runs() == [("sao", 0), ("sao-gae-obs", 0), ("sao", 1), ("sao-gae-obs", 1)]


def test_runs_at_once_share_the_cores_and_a_run_alone_has_them_all(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert torch_threads(alone=True, parallel=2) == 8
    assert torch_threads(alone=False, parallel=2) == 4
    assert torch_threads(alone=False, parallel=16) == 1
