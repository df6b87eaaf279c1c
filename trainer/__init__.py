"""sao-harness: trainer."""
