"""sao-harness: trainer — `sao train` (asynchronous SAO), its warm starts, and the reports of a run.

Rooms, top to bottom (each imports only the ones below it; `pyproject.toml`'s import-linter contracts):

    cli.py      `sao train`, `sao value-pretrain`, `sao sft`, `sao runs plot|compare`, `sao images pull`
    run/        the loop and its actors: TrainRun (loop), the engine replicas and rollout workers
                (actors, workers), the trace queue, weight publication (weight_sync), the rank actors
                of a data-parallel run (ranks), Ray (ray_utils), image pulls on every node (images)
    warm/       warm starts from stored traces: `sao sft` (sft, sft_dist), `sao value-pretrain`, corpus
    dist/       distribution and checkpoints: FSDP2 ranks (distributed), sharded builds and DCP
                (sharded), the checkpoint of a run (checkpoint)
    algo/       the algorithm: batches, GAE, losses, the objective, one SAO update (sao)
    modeling/   the models: policy logprobs and the critic (models), precision, critic_init,
                routing replay (router_replay)
    report/     a run's metrics.jsonl and TensorBoard (metrics), plots, compare

Beside them, under every room: config.py (the `trainer`, `runtime`, `cluster` sections) and gpu_plan.py.
"""
