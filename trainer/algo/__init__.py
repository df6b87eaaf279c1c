"""The algorithm (docs/algorithm.md): batches, GAE, losses, the configured objective, one SAO update."""
