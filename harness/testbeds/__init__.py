"""The test-bed envs of `trainer.env` (tests, bench, the learning test-bed), next to `swe` (harness.episode).

- `simulated`: real generations through the proxy, synthetic observations and sleeps (`testbed.simulated.*`).
- `toy`: the learning test-bed, a multi-turn parity game the tiny model learns in minutes (`testbed.toy.*`).
- `chain`: the long-horizon test-bed, 8 to 40 turns (heavy-tailed) whose one reward is decided at a few of
  them, across long filler observations (`testbed.chain.*`).

Each is an `EnvSpec` of `harness.runner.ENVS` (its episode function `fn(task, ctx, episode_id) -> Trajectory`);
their config sections are in `harness.testbeds.config` (cheap to import: the modules here load the proxy).
"""
