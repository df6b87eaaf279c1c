"""Each claim of `sao paper` decided from its arms' runs (the figures, intervals and rules: sao.paper_stats).

    C1 stability        final reward: SAO above each of GRPO, GRPO+DIS and VAPO; with each arm's peak and
                        collapse step (paper.collapse_drop, defined before running)
    C2 sample eff.      mean reward within the same number of trajectories sampled (the fewest any run
                        of the two arms sampled): SAO above GRPO
    C3 the critic       mean explained variance, K = 2 above K = 1; mean critic gradient norm, frozen
                        attention below the full critic; explained variance over the first
                        paper.ev_first_steps policy steps, pretrained above not
    C4 skip GAE         mean reward over the run: observation-skipping above GAE through observations
    C5 adaptive lambda  mean reward over the run: length-adaptive above lambda 0.95
    C6 staleness        mean reward over the run: DIS above no correction and above TIS (all at
                        trainer.max_staleness 4); the max_staleness sweep 1 / 4 / 16 and each arm's
                        masked fraction reported beside
    C7 async vs sync    trajectories per minute of training: async above sync; engine idle beside
    C8 online           mean adaptation lag after the preference shifts: SAO below the running mean
"""
from __future__ import annotations

from dataclasses import dataclass, field

from sao_harness.sao.paper_arms import CLAIMS
from sao_harness.sao.paper_stats import (
    CONTRADICTED,
    EV,
    INCONCLUSIVE,
    REPRODUCED,
    Interval,
    adaptation_lags,
    auc_reward,
    collapse_step,
    combine,
    final_reward,
    interval,
    mean,
    mean_over_first,
    peak_reward,
    reward_at_trajectories,
    series,
    trajectories_sampled,
    verdict,
)

MASKED, IDLE, TPH, CRITIC_GRAD = ("policy/dis_masked", "perf/engine_idle_frac", "perf/trajectories_per_hour",
                                  "critic/grad_norm")
SAMPLED = ("rollout/trajectories", "rollout/dropped_stale", "rollout/excluded_unrewarded")


@dataclass
class ClaimResult:
    """A claim's verdict, the text of its line, and its figures (arm -> figure -> Interval)."""

    id: str
    title: str
    verdict: str
    detail: str
    paper: str
    figures: dict[str, dict[str, Interval]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def line(self, tag: str = "") -> str:
        return f"paper: {self.id} {self.title}: {self.verdict} ({self.detail}){tag}"

    def to_dict(self) -> dict:
        return {"id": self.id, "title": self.title, "verdict": self.verdict, "detail": self.detail,
                "paper": self.paper, "notes": self.notes,
                "figures": {arm: {k: {"mean": v.mean, "half": v.half, "n": v.n} for k, v in figs.items()}
                            for arm, figs in self.figures.items()}}


def per_seed(runs: list[list[dict]], fn) -> Interval:
    return interval([fn(r) for r in runs])


def sampled(records: list[dict]) -> list[dict]:
    """Records whose `rollout/trajectories` counts every trajectory sampled (trained, stale, unrewarded)."""
    return [{**r, "rollout/trajectories": sum(float(r.get(k, 0.0)) for k in SAMPLED)} for r in records]


def _result(claim_id: str, v: str, detail: str, figures: dict, notes: list[str] | None = None) -> ClaimResult:
    claim = next(c for c in CLAIMS if c.id == claim_id)
    return ClaimResult(claim.id, claim.title, v, detail, claim.paper, figures, notes or [])


def c1(runs, plan, pc) -> ClaimResult:
    figs = {}
    for arm in CLAIMS[0].arms:
        collapses = [collapse_step(r, pc.collapse_drop) for r in runs[arm]]
        figs[arm] = {"final": per_seed(runs[arm], final_reward), "peak": per_seed(runs[arm], peak_reward),
                     "collapse_step": interval([c for c in collapses if c is not None]),
                     "collapsed_runs": Interval(float(sum(c is not None for c in collapses)), 0.0, len(collapses))}
    v = combine([verdict(figs["sao"]["final"], figs[arm]["final"]) for arm in ("grpo", "grpo+dis", "vapo")])
    g = figs["grpo"]
    collapsed = int(g["collapsed_runs"].mean) if g["collapsed_runs"].n else 0
    grpo = (f"GRPO collapsed at step {g['collapse_step'].text(0)} in {collapsed} of {g['collapsed_runs'].n} seeds"
            if collapsed else f"GRPO did not collapse in {plan.steps} steps ({g['collapsed_runs'].n} seeds)")
    return _result("C1", v, f"SAO final {figs['sao']['final'].text()}, GRPO final {g['final'].text()}, {grpo}", figs)


def c2(runs, plan, pc) -> ClaimResult:
    both = [sampled(r) for arm in ("sao", "grpo") for r in runs[arm]]
    budget = min((trajectories_sampled(r) for r in both), default=0.0)
    figs = {arm: {"reward_within_budget": per_seed([sampled(r) for r in runs[arm]],
                                                   lambda r: reward_at_trajectories(r, budget))}
            for arm in ("sao", "grpo")}
    v = verdict(figs["sao"]["reward_within_budget"], figs["grpo"]["reward_within_budget"])
    return _result("C2", v, f"mean reward within {budget:.0f} trajectories: SAO "
                   f"{figs['sao']['reward_within_budget'].text()}, GRPO {figs['grpo']['reward_within_budget'].text()}",
                   figs)


def c3(runs, plan, pc) -> ClaimResult:
    n = pc.ev_first_steps
    figs = {arm: {"ev_mean": per_seed(runs[arm], lambda r: mean(series(r, EV))),
                  "ev_first": per_seed(runs[arm], lambda r: mean_over_first(r, EV, n)),
                  "critic_grad_norm": per_seed(runs[arm], lambda r: mean(series(r, CRITIC_GRAD)))}
            for arm in CLAIMS[2].arms}
    k = verdict(figs["sao"]["ev_mean"], figs["sao-k1"]["ev_mean"])
    frozen = verdict(figs["sao"]["critic_grad_norm"], figs["sao-full-critic"]["critic_grad_norm"],
                     higher_is_better=False)
    pre = verdict(figs["sao"]["ev_first"], figs["sao-no-pretrain"]["ev_first"])
    detail = (f"EV K=2 {figs['sao']['ev_mean'].text()} vs K=1 {figs['sao-k1']['ev_mean'].text()}: {k}; "
              f"critic grad norm frozen {figs['sao']['critic_grad_norm'].text()} vs full "
              f"{figs['sao-full-critic']['critic_grad_norm'].text()}: {frozen}; EV first {n} steps pretrained "
              f"{figs['sao']['ev_first'].text()} vs not {figs['sao-no-pretrain']['ev_first'].text()}: {pre}")
    return _result("C3", combine([k, frozen, pre]), detail, figs)


def _two(claim_id: str, a: str, b: str, label_a: str, label_b: str, runs) -> ClaimResult:
    figs = {arm: {"mean_reward": per_seed(runs[arm], auc_reward), "final": per_seed(runs[arm], final_reward)}
            for arm in (a, b)}
    v = verdict(figs[a]["mean_reward"], figs[b]["mean_reward"])
    return _result(claim_id, v, f"mean reward {label_a} {figs[a]['mean_reward'].text()}, {label_b} "
                   f"{figs[b]['mean_reward'].text()}", figs)


def c4(runs, plan, pc) -> ClaimResult:
    return _two("C4", "sao", "sao-gae-obs", "skipping", "through observations", runs)


def c5(runs, plan, pc) -> ClaimResult:
    return _two("C5", "sao", "sao-lambda-0.95", "adaptive", "0.95", runs)


def c6(runs, plan, pc) -> ClaimResult:
    figs = {arm: {"mean_reward": per_seed(runs[arm], auc_reward),
                  "masked": per_seed(runs[arm], lambda r: mean(series(r, MASKED))),
                  "staleness": per_seed(runs[arm], lambda r: mean(series(r, "rollout/staleness_mean")))}
            for arm in CLAIMS[5].arms}
    v = combine([verdict(figs["sao"]["mean_reward"], figs[arm]["mean_reward"]) for arm in ("no-correction", "tis")])
    sweep = ", ".join(f"{s} {figs[arm]['mean_reward'].text()}"
                      for s, arm in (("1", "sao-stale-1"), ("4", "sao"), ("16", "sao-stale-16")))
    detail = (f"mean reward DIS {figs['sao']['mean_reward'].text()}, none {figs['no-correction']['mean_reward'].text()}"
              f", TIS {figs['tis']['mean_reward'].text()}; DIS masked {figs['sao']['masked'].text(4)}; "
              f"max_staleness {sweep}")
    return _result("C6", v, detail, figs)


def trajectories_per_minute(records: list[dict]) -> float | None:
    """Trajectories sampled per minute of the run (first to last step record)."""
    steps = [r for r in records if "step" in r and "time" in r]
    if len(steps) < 2:
        return None
    minutes = (float(steps[-1]["time"]) - float(steps[0]["time"])) / 60
    n = sum(float(r.get(k, 0.0)) for r in steps[1:] for k in SAMPLED)
    return n / minutes if minutes > 0 else None


def c7(runs, plan, pc) -> ClaimResult:
    figs = {arm: {"trajectories_per_min": per_seed(runs[arm], trajectories_per_minute),
                  "engine_idle": per_seed(runs[arm], lambda r: mean(series(r, IDLE)))}
            for arm in ("sao", "sao-sync")}
    v = verdict(figs["sao"]["trajectories_per_min"], figs["sao-sync"]["trajectories_per_min"])
    return _result("C7", v, f"trajectories/min async {figs['sao']['trajectories_per_min'].text(1)}, sync "
                   f"{figs['sao-sync']['trajectories_per_min'].text(1)}; engine idle async "
                   f"{figs['sao']['engine_idle'].text()}, sync {figs['sao-sync']['engine_idle'].text()}", figs)


def c8(runs, plan, pc) -> ClaimResult:
    def lag(records):
        lags = adaptation_lags(records, plan.shift_every)
        return sum(lags) / len(lags) if lags else None

    figs = {arm: {"adaptation_lag": per_seed(runs[arm], lag), "mean_reward": per_seed(runs[arm], auc_reward)}
            for arm in ("sao-online", "running-mean-online")}
    v = verdict(figs["sao-online"]["adaptation_lag"], figs["running-mean-online"]["adaptation_lag"],
                higher_is_better=False)
    return _result("C8", v, f"adaptation lag SAO {figs['sao-online']['adaptation_lag'].text(1)} steps, running mean "
                   f"{figs['running-mean-online']['adaptation_lag'].text(1)} (shift every {plan.shift_every} steps)",
                   figs, ["a shift never regained within the run counts the steps left (a lower bound)"])


DECIDE = (c1, c2, c3, c4, c5, c6, c7, c8)


def decide(runs: dict[str, list[list[dict]]], plan, pc) -> list[ClaimResult]:
    """The result of every claim of `plan.claims` from `runs` (arm -> each finished seed's metrics records)."""
    out = []
    for claim, fn in zip(CLAIMS, DECIDE):
        if claim.id in plan.claims:
            out.append(fn(runs, plan, pc))
    return out


def counts(results: list[ClaimResult]) -> tuple[int, int, int]:
    return (sum(r.verdict == REPRODUCED for r in results), sum(r.verdict == CONTRADICTED for r in results),
            sum(r.verdict == INCONCLUSIVE for r in results))

