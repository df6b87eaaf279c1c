"""The models: policy logprobs and the critic, mixed precision, where the critic starts, MoE routing replay."""
