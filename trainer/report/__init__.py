"""A run's record and views of it: metrics.jsonl and TensorBoard, plots, runs compared."""
