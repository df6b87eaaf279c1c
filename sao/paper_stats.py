"""The statistics of `sao paper`: per-seed figures of a run, 95% intervals over seeds, and a claim's verdict.

A figure of an arm is one number per seed (the seed is the unit: runs of one arm differ only in
`run.seed`). Over n seeds,

    mean +- t_{0.975, n-1} * s / sqrt(n)          s = the sample standard deviation (n - 1)

and a claim compares two arms, the one the paper favours (a) and the other (b), in the paper's direction
(higher is better, or lower is better):

    reproduced     a's interval lies entirely on the paper's side of b's (they separate that way)
    contradicted   b's interval lies entirely on that side of a's (they separate the other way)
    inconclusive   the intervals overlap, or an arm has fewer than 2 seeds with the figure

Figures of one run (`records`: its metrics.jsonl, policy steps only):

- `final_reward`: mean `rollout/reward_mean` over the last `FINAL_FRAC` of the policy steps.
- `auc_reward`: mean `rollout/reward_mean` over all policy steps (the area under the curve / steps).
- `collapse_step`: defined before any run: the first policy step at which the moving average of the
  reward (`COLLAPSE_WINDOW` steps) is more than `drop` below the highest moving average before it;
  None when that never happens (the run did not collapse).
- `reward_at_trajectories`: the mean reward of the steps whose cumulative trajectories sampled is
  at most `budget` (sample efficiency: the same number of trajectories for every arm).
- `adaptation_lags`: online learning, after each preference shift at step k * every: the steps until
  the moving average regains 90% of its value just before the shift; a shift never regained counts
  the steps left in the run (a lower bound, said so in the report).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from sao_harness.trainer.report.plots import moving_average

REWARD, EV = "rollout/reward_mean", "critic/explained_variance"
FINAL_FRAC = 0.2
COLLAPSE_WINDOW = 10
# two-sided 95%: t_{0.975, df} for df = 1..30 (beyond: 1.96)
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)
REPRODUCED, CONTRADICTED, INCONCLUSIVE = "reproduced", "contradicted", "inconclusive"


@dataclass(frozen=True)
class Interval:
    """mean +- half over `n` seeds (half = nan for n < 2)."""

    mean: float
    half: float
    n: int

    @property
    def lo(self) -> float:
        return self.mean - self.half

    @property
    def hi(self) -> float:
        return self.mean + self.half

    def text(self, digits: int = 2) -> str:
        if self.n == 0:
            return "n/a"
        if self.n < 2:
            return f"{self.mean:.{digits}f} (1 seed)"
        return f"{self.mean:.{digits}f} +- {self.half:.{digits}f}"


def interval(values: list[float]) -> Interval:
    """Mean and 95% t-interval half-width of per-seed values (None and nan left out)."""
    xs = [float(v) for v in values if v is not None and v == v]
    n = len(xs)
    if n == 0:
        return Interval(math.nan, math.nan, 0)
    mean = sum(xs) / n
    if n < 2:
        return Interval(mean, math.nan, 1)
    s = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    t = T975[n - 2] if n - 1 <= len(T975) else 1.96
    return Interval(mean, t * s / math.sqrt(n), n)


def verdict(a: Interval, b: Interval, higher_is_better: bool = True) -> str:
    """The claim "a beats b" (module doc): reproduced, contradicted or inconclusive."""
    if a.n < 2 or b.n < 2:
        return INCONCLUSIVE
    better, worse = (a, b) if higher_is_better else (b, a)
    if better.lo > worse.hi:
        return REPRODUCED
    if worse.lo > better.hi:
        return CONTRADICTED
    return INCONCLUSIVE


def combine(verdicts: list[str]) -> str:
    """Several comparisons of one claim: reproduced when every one is, contradicted when any is, else inconclusive."""
    if verdicts and all(v == REPRODUCED for v in verdicts):
        return REPRODUCED
    return CONTRADICTED if CONTRADICTED in verdicts else INCONCLUSIVE


def policy_steps(records: list[dict]) -> list[dict]:
    """The records of the steps that trained the policy (not critic-only updates), in step order."""
    return [r for r in records if "step" in r and r.get("policy/trained", 1.0) and REWARD in r]


def series(records: list[dict], key: str) -> list[float]:
    """`key` per policy step (nan where a step did not log it)."""
    return [float(r[key]) if isinstance(r.get(key), (int, float)) else math.nan for r in policy_steps(records)]


def mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x == x]
    return sum(xs) / len(xs) if xs else None


def final_reward(records: list[dict]) -> float | None:
    r = series(records, REWARD)
    return mean(r[-max(1, math.ceil(FINAL_FRAC * len(r))):]) if r else None


def auc_reward(records: list[dict]) -> float | None:
    return mean(series(records, REWARD))


def peak_reward(records: list[dict]) -> float | None:
    r = series(records, REWARD)
    return max(moving_average(r, COLLAPSE_WINDOW)) if r else None


def collapse_step(records: list[dict], drop: float) -> int | None:
    """The first policy step whose moving-average reward is more than `drop` below the best one before it."""
    steps = policy_steps(records)
    ma = moving_average(series(records, REWARD), COLLAPSE_WINDOW)
    best = -math.inf
    for rec, m in zip(steps, ma):
        if m < best - drop:
            return int(rec["step"])
        best = max(best, m)
    return None


def mean_over_first(records: list[dict], key: str, n: int) -> float | None:
    return mean(series(records, key)[:n])


def reward_at_trajectories(records: list[dict], budget: float) -> float | None:
    """Mean reward of the policy steps reached within `budget` cumulative trajectories sampled."""
    rewards, total = [], 0.0
    for r in policy_steps(records):
        total += float(r.get("rollout/trajectories", 0.0))
        if total > budget:
            break
        rewards.append(float(r[REWARD]))
    return mean(rewards)


def trajectories_sampled(records: list[dict]) -> float:
    return sum(float(r.get("rollout/trajectories", 0.0)) for r in policy_steps(records))


def adaptation_lags(records: list[dict], every: int, window: int = 5, regain: float = 0.9) -> list[int]:
    """Steps to regain `regain` of the pre-shift moving-average reward after each shift (module doc)."""
    steps = [int(r["step"]) for r in policy_steps(records)]
    ma = moving_average(series(records, REWARD), window)
    lags = []
    for k in range(1, (max(steps) if steps else 0) // every + 1):
        shift = k * every
        before = [m for s, m in zip(steps, ma) if s <= shift]
        after = [(s, m) for s, m in zip(steps, ma) if shift < s <= shift + every]
        if not before or not after:
            continue
        target = regain * before[-1]
        lag = next((s - shift for s, m in after if m >= target), None)
        lags.append(lag if lag is not None else after[-1][0] - shift)
    return lags
