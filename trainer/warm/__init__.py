"""Warm starts from stored traces.

`sao sft` (one process or FSDP2 ranks) and `sao value-pretrain`, and the corpus they read.
"""
