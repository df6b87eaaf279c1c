"""Below the CLI, `sao train`'s functions take the config sections they read (trainer.run.loop), and
`trainer.env` is checked against harness.runner's registry."""
from __future__ import annotations

import pytest

from sao_harness.core.errors import UserError
from sao_harness.harness import runner
from sao_harness.harness.config import SamplingConfig
from sao_harness.trainer.config import RuntimeConfig, TrainerConfig


def test_build_trainer_recomputes_under_the_sampling_section_on_the_runtime_device(tiny_model_dir):
    from sao_harness.trainer.run.loop import build_trainer  # lazy: torch

    tc = TrainerConfig(advantage="running_mean")  # no critic: quick
    sampling = SamplingConfig(temperature=0.7, top_k=5, top_p=0.9)
    policy, critic, trainer, tokenizer = build_trainer(tc, sampling, "cpu", str(tiny_model_dir), "float32", None)
    assert trainer.config is tc and critic is None and trainer.device.type == "cpu"
    assert (trainer.sampling.temperature, trainer.sampling.top_k, trainer.sampling.top_p) == (0.7, 5, 0.9)


def test_the_loop_checks_read_trainer_and_runtime():
    from sao_harness.trainer.run.loop import _check  # lazy: torch

    ppo = TrainerConfig(policy_loss="ppo", minibatches=2)
    _check(ppo, RuntimeConfig())  # one process: minibatches are fine
    with pytest.raises(UserError, match=r"runtime.world_size=2 needs trainer.minibatches=1"):
        _check(ppo, RuntimeConfig(world_size=2))


def test_trainer_env_is_one_of_the_registry(monkeypatch):
    with pytest.raises(ValueError, match=r"unknown env 'custom' \(known: chain, simulated, swe, toy\)"):
        TrainerConfig(env="custom")
    fn = lambda task, ctx, episode_id: None  # noqa: E731
    monkeypatch.setitem(runner.ENVS, "custom", runner.EnvSpec("custom", fn, "a test env"))
    assert TrainerConfig(env="custom").env == "custom"
    assert runner.episode_function("custom") is fn
    with pytest.raises(ValueError, match="registered already"):
        runner.register_env(runner.EnvSpec("custom", fn, "again"))


def test_registry_entries_are_imported_on_first_use():
    from sao_harness.harness.testbeds.toy import run_toy_episode

    assert runner.ENVS["toy"].episode == "sao_harness.harness.testbeds.toy:run_toy_episode"
    assert runner.episode_function("toy") is run_toy_episode
    with pytest.raises(UserError, match=r"trainer.env='nope': no episode function"):
        runner.episode_function("nope")


def test_env_specs_say_what_a_run_needs(tmp_path):
    """What the trainer's env branches used to ask: swe pre-flights and cleans its sandboxes up; simulated's
    sleep engine stands in only with testbed.simulated.engine_s; a test-bed runs in no scope."""
    from sao_harness.sao.config import load_config

    swe, sim, toy = runner.env_spec("swe"), runner.env_spec("simulated"), runner.env_spec("toy")
    assert swe.preflight and not sim.preflight and not toy.preflight
    assert swe.scope == "sao_harness.envs.gc:run_scope" and toy.scope is None
    cfg = load_config(None, [])
    assert sim.stand_in_name(cfg) is None and swe.stand_in_name(cfg) is None
    assert sim.stand_in_name(load_config(None, ["testbed.simulated.engine_s=0.1"])) == "sleep (simulated)"
    with toy.run_scope("run-x"):  # a null context
        pass
    with pytest.raises(UserError, match="no runnable tasks"):
        toy.prepared(cfg, [])
