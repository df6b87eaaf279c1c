"""sao-harness: eval."""
