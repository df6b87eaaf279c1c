"""Config sections of the test-bed envs: `testbed.<env>.*` is read by `trainer.env: <env>` alone.

The scheme: one subsection per env, named like the env; its keys are the env's, without a prefix
(`testbed.toy.turns`, `testbed.simulated.engine_s`).
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from sao_harness.core.config import Section


class ToyConfig(Section):
    """`trainer.env: toy` (harness.testbeds.toy): reward = stake x fraction of turns that start with the named
    parity."""

    turns: int = Field(3, gt=0, description="turns per episode (the reward needs every one of them)")
    target: Literal["episode", "turn", "even"] = Field(
        "episode", description="the parity the observations name: drawn once per episode, once per turn, or "
        "always even")
    repeat: int = Field(8, gt=0, description="times each observation repeats the parity word")
    stakes: float = Field(0.0, ge=0, lt=1, description="per-episode stake named in the first message, low or "
                          "high: the reward is scaled by 1 - stakes or 1 + stakes (0 = off)")


class ChainConfig(Section):
    """`trainer.env: chain` (harness.testbeds.chain): long, heavy-tailed episodes; reward = fraction of the decision
    turns whose reply starts with the named parity."""

    turns_min: int = Field(8, gt=0, description="turns per episode = min(turns_max, floor(turns_min * X)), "
                           "X ~ Pareto(turns_alpha): the shortest episode")
    turns_max: int = Field(40, gt=0, description="the longest episode, in turns")
    turns_alpha: float = Field(2.0, gt=0, description="Pareto index of the turn count (smaller = heavier tail; "
                               "2: median floor(turns_min * 1.41), P(turns_max) = (turns_min / turns_max)^2)")
    decisions: int = Field(3, gt=0, description="turns whose reply the reward counts: the first and "
                           "decisions - 1 drawn among the rest (at most turns_min)")
    target: Literal["decision", "episode"] = Field(
        "decision", description="the parity each decision must have: drawn once per decision or once per episode")
    repeat: int = Field(4, gt=0, description="times a decision's observation repeats the parity word")
    obs_words_median: float = Field(24.0, gt=0, description="filler words per observation ~ "
                                    "LogNormal(log(median), obs_words_sigma), clipped to [obs_words_min, "
                                    "obs_words_max]")
    obs_words_sigma: float = Field(1.0, ge=0, description="sigma of the filler words per observation")
    obs_words_min: int = Field(8, gt=0, description="the fewest filler words in one observation")
    obs_words_max: int = Field(240, gt=0, description="the most filler words in one observation")
    shift_every: int | None = Field(None, gt=0, description="online learning: the preference flips every M "
                                    "policy versions (the reward counts the other parity in odd phases); null = "
                                    "never")

    @model_validator(mode="after")
    def _consistent(self) -> ChainConfig:
        if self.turns_min > self.turns_max:
            raise ValueError(f"testbed.chain.turns_min={self.turns_min} is above turns_max={self.turns_max}")
        if self.decisions > self.turns_min:
            raise ValueError(f"testbed.chain.decisions={self.decisions} is above turns_min={self.turns_min}")
        if self.obs_words_min > self.obs_words_max:
            raise ValueError(f"testbed.chain.obs_words_min={self.obs_words_min} is above "
                             f"obs_words_max={self.obs_words_max}")
        return self


class SimulatedConfig(Section):
    """`trainer.env: simulated` (harness.testbeds.simulated; tests, bench): real generations through the proxy,
    synthetic observations, sleeps."""

    turns_median: float = Field(4.0, gt=0, description="turns per episode ~ LogNormal(log(median), sigma), "
                                "clipped to [1, turns_max]")
    turns_sigma: float = Field(0.0, ge=0, description="sigma of the turn count (0 = every episode has "
                               "turns_median turns)")
    turns_max: int = Field(16, gt=0, description="longest episode, in turns")
    env_sleep_s: float = Field(0.02, ge=0, description='the environment\'s seconds per turn (the "tool '
                               'execution")')
    infra_error_rate: float = Field(0.0, ge=0, le=1, description="fraction of episodes that end as an "
                                    "injected infra_error")
    engine_s: float | None = Field(None, gt=0, description="null = the configured engine generates; a number = "
                                   "a stand-in engine that sleeps this many seconds per turn (bench: the "
                                   "pipeline, not the model)")


class TestbedConfig(Section):
    """The test-bed envs of `trainer.env` (harness.testbeds), one subsection each."""

    __test__ = False  # not a pytest test class

    toy: ToyConfig = ToyConfig()
    chain: ChainConfig = ChainConfig()
    simulated: SimulatedConfig = SimulatedConfig()
