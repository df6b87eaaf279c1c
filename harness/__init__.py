"""sao-harness: harness."""
