"""Config sections of the harness: the model, the engine (one model per kind: ``harness.engines.config``) and
its sampling, the proxy, the agent, rollouts; and ``HarnessConfig``, the run config harness code reads (these
sections and those of the layers below).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, SerializeAsAny, field_validator

from sao_harness.core.config import RunConfig, Section
from sao_harness.envs.config import DockerConfig, SandboxConfig
from sao_harness.harness.engines.config import EngineBase, HFEngineConfig, engine_config
from sao_harness.harness.testbeds.config import TestbedConfig
from sao_harness.harness.tiny_model import MODEL_SHAPE, resolve_model_path
from sao_harness.tasks.config import GradingConfig, TasksConfig


class ModelConfig(Section):
    """The policy model: the project's tiny model, a local directory or a Hugging Face model id."""

    path: str = Field("tiny", description="`tiny` (built locally into cache_dir), a local model directory, or a "
                      "Hugging Face model id (from the local Hugging Face cache, or the hub where reachable)")
    cache_dir: Path = Field(Path(".cache/sao"), description="where the tiny model is built (once per recipe)")
    tiny_seed: int = Field(0, description="the tiny model's weights and tokenizer are a function of this seed")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="weights' dtype in the "
                                                             "engine and the trainer")
    config: dict = Field({}, description="config.json fields of a model not on this machine (model_type, "
                         "hidden_size, num_hidden_layers, ...): the GPU plan's shapes (`sao config`); where "
                         "config.json is here, a field that differs from it is an error")


class SamplingConfig(Section):
    """How the rollout engine samples the policy's tokens."""

    temperature: float = Field(1.0, ge=0.0, description="rollout sampling temperature (0 = greedy)")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling (1 = off)")
    top_k: int = Field(0, ge=0, description="top-k sampling (0 = off)")
    max_tokens: int = Field(1024, gt=0, description="tokens generated per model turn at most")


TOKEN_ENV = "SAO_PROXY_TOKEN"  # the proxy token when proxy.token is unset (keeps it out of configs)


class ProxyConfig(Section):
    """The OpenAI-compatible proxy between the agent and the engine (`sao serve`, episodes)."""

    host: str = Field("127.0.0.1", description="sao serve: address to listen on (loopback, or a routable "
                      "address only with proxy.token set)")
    port: int = Field(8000, ge=0, lt=65536, description="sao serve: port (0 = any free one)")
    context_budget: int = Field(131_072, gt=0, description="tokens per episode; past it the turn ends with "
                                "finish_reason `length` and the episode is truncated_context; capped at the "
                                "model's length (engine.max_model_len, else its max_position_embeddings): "
                                "`sao config` prints the budget in force")
    tool_format: Literal["native", "prompt"] = Field("native", description="the agent's tool-call format: native "
                                                     "tools, or tools described in the prompt text")
    tool_parser: str | None = Field(None, description="how tool calls are read from the model's text, by vLLM's "
                                    "--tool-call-parser names: hermes, qwen3_coder, llama3_json, glm45, none; null "
                                    "= the format the chat template teaches")
    reasoning_parser: str | None = Field(None, description="how reasoning is split out of the reply into "
                                         "reasoning_content, by vLLM's --reasoning-parser names: qwen3, glm45, "
                                         "deepseek_r1, none; null = qwen3 (glm45) if the template has </think>")
    chat_template: Path | None = Field(None, description="a Jinja chat template file used instead of the "
                                       "tokenizer's (e.g. one that keeps past reasoning)")
    chat_template_kwargs: dict = Field({}, description="extra variables for every render of the chat template, "
                                       "e.g. {enable_thinking: false}")
    full_history_check: bool = Field(False, description="compare every message every turn (catches in-place "
                                     "edits of the history; O(history) per turn)")
    max_request_bytes: int = Field(8 * 1024 * 1024, gt=0, description="largest request body accepted; a larger "
                                   "one is answered 413")
    token: str | None = Field(None, description="bearer token every request must carry (`Authorization: Bearer "
                              "...`); null = the SAO_PROXY_TOKEN environment variable, unset = no authentication")

    def resolved_token(self) -> str | None:
        """The token in force: ``proxy.token`` if set, else ``$SAO_PROXY_TOKEN`` if non-empty, else None."""
        return self.token or os.environ.get(TOKEN_ENV) or None


class AgentConfig(Section):
    """The OpenHands agent of an episode."""

    max_iterations: int = Field(300, gt=0, description="LLM turns per episode, nudges included")
    max_nudges: int = Field(10, ge=0, description='"please continue" replies to a turn without a tool call')
    stuck_detection: bool = Field(True, description="the SDK's stuck detector, as the official runner keeps it")
    no_change_timeout_s: int | None = Field(None, description='terminal "no new output" timeout in seconds; '
                                            "null = the SDK's 30 s")
    max_command_s: float = Field(600.0, gt=0, description="wall time one terminal call may take, whatever timeout "
                                 "the agent asks for and even while the command keeps printing; past it the "
                                 "command gets ^C, then its shell is killed")
    model: str = Field("openai/sao-policy", description="litellm route to the proxy (the proxy ignores the name)")
    profile: Literal["openhands", "compact"] = Field(
        "openhands", description="openhands: the SDK's system prompt, tool texts and the official SWE-bench "
        "instruction, unchanged; compact: the same agent and tools with a short system prompt, tool texts and "
        "instruction (short episodes for CPU training)")


class RolloutConfig(Section):
    """Episodes in parallel and their retries."""

    workers: int = Field(2, gt=0, description="episodes run in parallel (the rollout workers in train); a "
                         "proxy serves as many turns at once (at least 40)")
    max_retries: int = Field(2, ge=0, description="retries of an episode that ended in an infra error")
    # 0.2: infra errors never train (never a 0), and they are not random (big images, long test suites, memory-hungry
    # tasks fail more): past one in five the sample is skewed towards what the infrastructure copes with, while a
    # healthy run loses a few percent; the minimum count keeps a burst of early failures from stopping a run
    max_infra_frac: float | None = Field(0.2, ge=0, le=1, description="stop the run (an error listing the kinds) "
                                         "once more than this share of the finished episodes are infra errors "
                                         "(rollout/infra_frac), checked from max(20, 2 x trainer.batch_size) "
                                         "finished (sao rollout: 2 x rollout.workers); null = never")
    episodes_per_task: int = Field(1, gt=0, description="sao rollout: trajectories per task")
    node_resources: dict[str, float] = Field({}, description="sao train: custom Ray resources each rollout worker "
                                             "takes, e.g. {docker: 1} on nodes started with --resources "
                                             "'{\"docker\": N}'; {} = on an engine replica's node")


class HarnessConfig(Section):
    """The sections harness code may read: its own and those of the layers below. The run config
    (``sao.config.Config``) extends it with the sections of the layers above."""

    run: RunConfig = RunConfig()
    model: ModelConfig = ModelConfig()
    engine: SerializeAsAny[EngineBase] = HFEngineConfig()  # the model of engine.kind (harness.engines.config)
    sampling: SamplingConfig = SamplingConfig()
    proxy: ProxyConfig = ProxyConfig()
    agent: AgentConfig = AgentConfig()
    rollout: RolloutConfig = RolloutConfig()
    docker: DockerConfig = DockerConfig()
    sandbox: SandboxConfig = SandboxConfig()
    tasks: TasksConfig = TasksConfig()
    grading: GradingConfig = GradingConfig()
    testbed: TestbedConfig = TestbedConfig()

    @field_validator("engine", mode="before")
    @classmethod
    def _engine_of_its_kind(cls, v):
        """``engine`` is the model of its ``engine.kind`` (hf where absent)."""
        return engine_config(v)


@dataclass(frozen=True)
class ContextBudget:
    """The context budget in force (``context_budget(cfg)``)."""

    tokens: int  # tokens per episode: the smaller of proxy.context_budget and model_max
    source: str  # what set it: "proxy.context_budget", "engine.max_model_len" or "max_position_embeddings ..."
    model_max: int | None  # the model's maximum length; None: unknown
    warning: str | None = None  # why model_max is unknown (the budget is then proxy.context_budget alone)

    def describe(self) -> str:
        """One line: the budget and where it comes from."""
        line = f"context budget {self.tokens} tokens (from {self.source}"
        if self.model_max is not None and self.source == "proxy.context_budget":
            line += f"; the model allows {self.model_max}"
        return line + ")" + (f"; {self.warning}" if self.warning else "")


def context_budget(cfg: HarnessConfig) -> ContextBudget:
    """The effective context budget of ``cfg``: the smaller of ``proxy.context_budget`` and the model's
    maximum length, which is ``engine.max_model_len`` where set, else the ``max_position_embeddings`` of
    the model's config (the tiny model: its recipe; a directory or a Hugging Face id: its config.json,
    read offline). Where that config cannot be read (e.g. a hub id not in the local cache), the budget
    is ``proxy.context_budget`` and ``warning`` says why. The proxy and ``sao config`` both use this."""
    configured = cfg.proxy.context_budget
    model_max, source, warning = cfg.engine.max_model_len, "engine.max_model_len", None
    if model_max is None:
        model_max, source, warning = _max_position_embeddings(cfg.model)
    if model_max is not None and model_max < configured:
        return ContextBudget(model_max, source, model_max)
    return ContextBudget(configured, "proxy.context_budget", model_max, warning)


def _max_position_embeddings(model_cfg) -> tuple[int | None, str, str | None]:
    """``(max_position_embeddings or None, where it was read, why it could not be)`` of ``model.path``."""
    if model_cfg.path == "tiny":  # the recipe's value, without building the model
        return MODEL_SHAPE["max_position_embeddings"], "max_position_embeddings of the tiny model", None
    from transformers import AutoConfig  # lazy: transformers is heavy

    path = resolve_model_path(model_cfg)
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        length = getattr(config.get_text_config(), "max_position_embeddings", None)
    except Exception as e:  # noqa: BLE001  (any reason the config is unreadable: fall back, and say so)
        reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        return None, "", (f"the model config of {path!r} could not be read ({reason[:300]}): the model's "
                          "maximum length is unknown, so the budget is proxy.context_budget alone")
    if not isinstance(length, int) or length <= 0:
        return None, "", (f"the model config of {path!r} has no max_position_embeddings: the model's maximum "
                          "length is unknown, so the budget is proxy.context_budget alone")
    return length, f"max_position_embeddings of {path}", None
