"""The learning test-bed (harness.testbeds.toy, configs/learn-toy.yaml): SAO raises the reward; a trainer whose
advantages have the wrong sign does not (the power check of the same assertion).

Budget: both runs together in about 2.5 minutes on 2 CPU cores. The sign-flipped run is shorter: its
reward falls from the first steps on (rise -0.12 and -0.27 after FLIP_STEPS steps, measured), so a
longer run only widens the gap to MIN_RISE."""
from __future__ import annotations

import math

import pytest

import sao_harness.trainer.algo.objective as objective
from sao_harness.harness.testbeds.toy import prompt, stake, targets, toy_reward
from sao_harness.harness.trace import Segment, Trajectory
from sao_harness.sao.config import load_config
from sao_harness.trainer.report.compare import WINDOW, compare_runs, summarize
from sao_harness.trainer.report.metrics import read_metrics

STEPS = 36
FLIP_STEPS = 12
MIN_RISE = 0.2  # reward mean of the last 5 steps minus the first 5 (compare.summarize). At 24 steps SAO
# rose 0.27-0.45 over 6 runs at first, later 0.190, 0.200 and 0.194 (red at this threshold): 24 steps sat on
# the edge. One run read at 24 / 32 / 36 / 40 steps: 0.194 / 0.308 / 0.316 / 0.356. Sign-flipped: -0.12 and
# -0.27 (12 steps).


@pytest.fixture(scope="module")
def ray_session():
    import ray  # lazy: heavy

    from sao_harness.trainer.run.ray_utils import start_ray

    start_ray(None, log=lambda m: None)
    yield
    ray.shutdown()


def toy_cfg(tmp_path, name, project_root, steps):
    return load_config(project_root / "configs/learn-toy.yaml",
                       [f"run.root={tmp_path}", f"run.name={name}", f"model.cache_dir={project_root / '.cache/sao'}",
                        f"trainer.max_steps={steps}", "trainer.save_every=1000", "runtime.batch_timeout_s=300"])


def summary(run_dir) -> dict:
    return summarize("run", read_metrics(run_dir))


def test_reward_counts_the_named_parity_per_turn_times_the_stake():
    def traj(*firsts):
        segs = []
        for tok in firsts:
            segs += [Segment("observation", [5, 6]), Segment("action", [tok, 9], [-1.0, -1.0], [0, 0])]
        return Trajectory(task_id="t", segments=segs)

    assert toy_reward(traj(2, 3, 4), ["even", "even", "even"]) == pytest.approx(2 / 3)
    assert toy_reward(traj(2, 3, 4), ["even", "odd", "even"]) == 1.0
    assert toy_reward(traj(2, 3, 4), ["even", "odd", "even"], 1.25) == 1.25
    assert toy_reward(traj(2), ["even", "even", "even"]) == pytest.approx(1 / 3)  # a missing turn scores 0
    assert targets("e1", 3, "even") == ["even"] * 3
    drawn = [targets(f"e{i}", 3, "episode") for i in range(200)]
    assert all(len(set(t)) == 1 for t in drawn) and 60 < sum(t[0] == "even" for t in drawn) < 140


def test_the_stake_is_drawn_per_episode_and_named_first():
    assert stake("e1", 0.0) == ("", 1.0)
    stakes = [stake(f"e{i}", 0.25) for i in range(400)]
    assert {s for s in stakes} == {("low", 0.75), ("high", 1.25)}
    assert 140 < sum(w == "high" for w, _ in stakes) < 260
    # drawn independently of the target: all four (stake, target) pairs are common
    pairs = [(stake(f"e{i}", 0.25)[0], targets(f"e{i}", 3, "episode")[0]) for i in range(400)]
    assert min(pairs.count(p) for p in {("low", "even"), ("low", "odd"), ("high", "even"), ("high", "odd")}) > 60
    assert prompt("odd", 2, "high") == "high high odd odd" and prompt("odd", 2) == "odd odd"


@pytest.mark.slow
def test_sao_raises_the_reward_and_a_sign_flipped_trainer_does_not(ray_session, project_root, tmp_path, monkeypatch):
    from sao_harness.trainer.run.loop import train  # lazy: imports torch

    cfg = toy_cfg(tmp_path, "sao", project_root, STEPS)
    assert (cfg.trainer.advantage, cfg.trainer.policy_loss, cfg.trainer.env) == ("gae", "dis", "toy")
    train(cfg, log=lambda m: None)
    good = summary(cfg.run.dir)
    assert good["rise"] >= MIN_RISE, f"SAO on the toy env: reward rose by {good['rise']:.3f} in {STEPS} steps"
    assert good["ev_last5"] is not None and math.isfinite(good["ev_last5"])  # the critic's metric is logged

    # power: the same run and assertion with the advantages' sign flipped must fail
    honest = objective.compute_advantages

    def flipped(*args, **kwargs):
        advantages, returns = honest(*args, **kwargs)
        return -advantages, returns

    monkeypatch.setattr(objective, "compute_advantages", flipped)
    bad_cfg = toy_cfg(tmp_path, "sabotaged", project_root, FLIP_STEPS)
    train(bad_cfg, log=lambda m: None)
    bad = summary(bad_cfg.run.dir)
    assert bad["rise"] < MIN_RISE, f"a sign-flipped trainer passed the learning test (rise {bad['rise']:.3f})"

    rows, paths = compare_runs([cfg.run.dir, bad_cfg.run.dir], tmp_path / "compare")
    assert [r["run"] for r in rows] == ["sao", "sabotaged"] and all(p.stat().st_size > 0 for p in paths)
    assert len(read_metrics(cfg.run.dir)) == STEPS >= 2 * WINDOW
    print(f"\nlearn-toy: SAO rise {good['rise']:.3f} (EV last5 {good['ev_last5']:.3f}) in {STEPS} steps; "
          f"sign-flipped rise {bad['rise']:.3f} in {FLIP_STEPS} steps; threshold {MIN_RISE}")
