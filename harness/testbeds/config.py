"""Config sections of the test-bed envs: `testbed.<env>.*` is read by `trainer.env: <env>` alone.

The scheme: one subsection per env, named like the env; its keys are the env's, without a prefix
(`testbed.toy.turns`, `testbed.simulated.engine_s`).
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field

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
    simulated: SimulatedConfig = SimulatedConfig()
