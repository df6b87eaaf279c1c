"""The test-bed envs of `trainer.env` (tests, bench, the learning test-bed), next to `swe` (harness.episode).

- `simulated`: real generations through the proxy, synthetic observations and sleeps (`testbed.simulated.*`).
- `toy`: the learning test-bed, a multi-turn parity game the tiny model learns in minutes (`testbed.toy.*`).

Both are episode functions `fn(task, ctx, episode_id) -> Trajectory` in `harness.runner.EPISODES`;
their config sections are in `harness.testbeds.config` (cheap to import: the modules here load the proxy).
"""
