"""Distribution and checkpoints: FSDP2 data-parallel ranks, sharded builds and DCP, a run's checkpoints."""
