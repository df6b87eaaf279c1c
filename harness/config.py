"""Config sections of the harness: the model, the engine and its sampling, the proxy, the agent, rollouts."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from core.config import Section


class ModelConfig(Section):
    # "tiny" builds the project's tiny Qwen3-MoE model into cache_dir; otherwise a local path or a
    # Hugging Face model id (loaded from the local Hugging Face cache / hub where reachable).
    path: str = "tiny"  # "tiny" (built locally), a local model directory, or a Hugging Face model id
    cache_dir: Path = Path(".cache/sao")  # where the tiny model is built (once per recipe)
    tiny_seed: int = 0  # the tiny model's weights and tokenizer are a function of this seed
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # weights' dtype in engine and trainer


class SamplingConfig(Section):
    temperature: float = Field(1.0, ge=0.0)  # rollout sampling temperature (0 = greedy)
    top_p: float = Field(1.0, gt=0.0, le=1.0)  # nucleus sampling (1 = off)
    top_k: int = Field(0, ge=0)  # top-k sampling (0 = off)
    max_tokens: int = Field(1024, gt=0)  # tokens per model turn


class EngineConfig(Section):
    kind: Literal["hf", "vllm", "scripted"] = "hf"  # hf: transformers on CPU; vllm: GPUs; scripted: test double
    device: str = "cpu"  # torch device of the hf engine
    max_batch: int = Field(8, gt=0)  # requests decoded together (hf)
    timeout_s: float = Field(600.0, gt=0)  # per engine call
    num_threads: int = Field(0, ge=0)  # hf: torch threads of the engine; 0 = automatic (1 for tiny models)
    # vllm only
    tensor_parallel_size: int = Field(1, gt=0)  # vllm: GPUs per engine
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1)  # vllm: fraction of GPU memory it may take
    max_model_len: int | None = Field(None, gt=0)  # vllm: context length (None: the model's)


class ProxyConfig(Section):
    host: str = "127.0.0.1"  # sao serve: loopback only
    port: int = Field(8000, ge=0, lt=65536)  # sao serve: port (0 = any free one)
    context_budget: int = Field(131_072, gt=0)  # tokens per episode; past it: finish_reason length, truncated_context
    tool_format: Literal["native", "prompt"] = "native"  # the agent's tool-call format (native tools / prompt text)
    full_history_check: bool = False  # compare every message every turn (catches in-place edits; O(history))


class AgentConfig(Section):
    max_iterations: int = Field(300, gt=0)  # LLM turns per episode, nudges included
    max_nudges: int = Field(10, ge=0)  # "please continue" replies to a turn without a tool call
    stuck_detection: bool = True  # the SDK's stuck detector, as the official runner keeps it
    no_change_timeout_s: int | None = None  # terminal "no new output" timeout; None = the SDK's 30 s
    model: str = "openai/sao-policy"  # litellm route to the proxy; the proxy ignores the name


class RolloutConfig(Section):
    workers: int = Field(2, gt=0)  # episodes run in parallel (rollout workers in train)
    max_retries: int = Field(2, ge=0)  # retries of an episode that ended in an infra error
    episodes_per_task: int = Field(1, gt=0)  # sao rollout: trajectories per task
