"""sao-harness: tasks."""
