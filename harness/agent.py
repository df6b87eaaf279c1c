"""The OpenHands agent of an episode: SDK ``LocalConversation``, LLM at the proxy, tools in the sandbox.

Contract:
- ``run_agent(sandbox, base_url=..., instruction=..., episode_id=..., task_id=..., settings=...)``
  runs one episode's agent loop to its end and returns an ``AgentResult``; it never raises for what
  happens inside the loop (LLM/proxy failures, sandbox failures, agent errors are classified in the
  result), only for bad arguments or a sandbox that cannot be attached at all (``SandboxUnavailable``).
- The agent is the SDK's ``Agent`` (``condenser=None``, the SDK's system prompt in CLI mode, tools
  ``terminal``, ``file_editor``, ``finish``, ``think`` exactly as the SDK defines them); the LLM is
  ``openhands.sdk.LLM`` at ``base_url`` (OpenAI-compatible) with ``X-Episode-Id`` / ``X-Task-Id``
  headers, ``num_retries=0``, temperature / top_p / max_tokens (sent as ``max_completion_tokens``)
  and top_k (in the body) sent; reasoning_effort, prompt_cache_key and cache markers never sent.
- ``native_tool_calling`` True: OpenAI ``tools`` / ``tool_calls``; False: tool specs in the system
  prompt, ``<function=...>`` blocks in text, ``stop=["</function"]``.
- A reply without a tool call gets the official SWE-bench runner's "please continue" nudge, at most
  ``max_nudges`` times; ``max_iterations`` bounds the LLM turns of the whole episode (nudges included).
- End states: ``finish`` -> finished; the SDK's ``MaxIterationsReached`` -> hit_max_iterations; LLM,
  proxy or HTTP failure -> error_kind ``infra`` (context-window overflow: ``context``); the sandbox
  dying mid-episode -> ``infra`` before the next LLM request; other failures -> ``agent``;
  ``AgentResult.status`` maps these onto the trace statuses.
- The ``instruction`` is ``harness.prompts.instruction_for(problem_statement, base_commit)``: the OpenHands
  SWE-bench prompt.
- ``settings.profile``: ``openhands`` (default) is the SDK's prompt and tool texts, unchanged; ``compact``
  is the same agent and tools with ``harness.prompts.COMPACT_SYSTEM_PROMPT`` and the short tool texts
  of ``harness.tools.registry`` (pair it with ``instruction_for(..., profile="compact")``).
- The SDK is imported once per process (``load_sdk()``, lazily, ~5-7 s).
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from enum import StrEnum, auto
from typing import Any

from pydantic import PrivateAttr

from sao_harness.envs.errors import SandboxError
from sao_harness.harness.prompts import COMPACT_SYSTEM_PROMPT, nudge_text
from sao_harness.harness.trace import Status

DEFAULT_MODEL = "openai/sao-policy"  # litellm's OpenAI-compatible route; the proxy ignores the name


# ------------------------------------------------------------------------------------------- SDK

_SDK: dict[str, Any] = {}


def load_sdk() -> dict[str, Any]:
    """Import the OpenHands SDK once per process (sets LITELLM_LOCAL_MODEL_COST_MAP first)."""
    if not _SDK:
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")
        # lazy: the openhands SDK (~5-7 s); litellm, openai, httpx and docker come with it or are as heavy
        import docker
        import httpx
        import litellm
        import openai
        from openhands.sdk import LLM, Agent, Message, TextContent
        from openhands.sdk.conversation.exceptions import ConversationRunError
        from openhands.sdk.conversation.impl.local_conversation import LocalConversation
        from openhands.sdk.conversation.state import ConversationExecutionStatus
        from openhands.sdk.event import ActionEvent, AgentErrorEvent, MessageEvent, ObservationEvent
        from openhands.sdk.event.conversation_error import ConversationErrorEvent
        from openhands.sdk.llm import exceptions as llm_exc
        from openhands.sdk.tool.builtins import FinishAction

        from sao_harness.harness.tools import SandboxTarget, SandboxTools, SandboxUnavailable  # lazy: imports the SDK

        class EpisodeLLM(LLM):
            """``LLM`` counting its requests (the SDK's metrics skip replies it could not parse)."""

            _requests: list = PrivateAttr(default_factory=list)
            _abort: Any = PrivateAttr(default=None)  # () -> exception to raise instead of a request

            def generate(self, *args, **kwargs):
                failure = self._abort() if self._abort is not None else None
                if failure is not None:
                    raise failure
                self._requests.append(time.time())
                return super().generate(*args, **kwargs)

            def post_response_prompt_mock(self, *args, **kwargs):
                """Prompt-format calls: an array parameter nested deeper than Python recurses is a malformed
                call the agent is shown (the SDK catches only JSONDecodeError: it was an agent_error)."""
                try:
                    return super().post_response_prompt_mock(*args, **kwargs)
                except RecursionError:
                    raise llm_exc.FunctionCallValidationError(
                        "A parameter is nested too deeply to be parsed.") from None

        if "LOG_LEVEL" not in os.environ:  # an episode's routine INFO lines (and the in-memory store notice)
            logging.getLogger("openhands").setLevel(logging.WARNING)
            logging.getLogger("openhands.sdk.conversation.state").setLevel(logging.ERROR)
        _SDK.update(LLM=LLM, EpisodeLLM=EpisodeLLM, Agent=Agent, Message=Message, TextContent=TextContent,
                    LocalConversation=LocalConversation, Status=ConversationExecutionStatus,
                    ConversationRunError=ConversationRunError, ActionEvent=ActionEvent,
                    AgentErrorEvent=AgentErrorEvent, MessageEvent=MessageEvent,
                    ObservationEvent=ObservationEvent, ConversationErrorEvent=ConversationErrorEvent,
                    llm_exc=llm_exc, FinishAction=FinishAction, SandboxTarget=SandboxTarget,
                    SandboxTools=SandboxTools, SandboxUnavailable=SandboxUnavailable,
                    # failures of the LLM/proxy transport and of Docker: infrastructure (classify_error)
                    system_errors=(litellm.exceptions.APIError, litellm.exceptions.APIConnectionError,
                                   litellm.exceptions.Timeout, openai.APIError, httpx.HTTPError,
                                   docker.errors.DockerException, SandboxError))
    return _SDK


# -------------------------------------------------------------------------------------- settings

@dataclass
class AgentSettings:
    """Per-run agent settings (``AgentSettings.from_config(cfg)`` maps the run config)."""

    model: str = DEFAULT_MODEL
    api_key: str = "sao-local"  # the proxy ignores it; litellm wants one
    max_iterations: int = 300  # LLM turns per episode, nudged continuations included
    max_nudges: int = 10
    native_tool_calling: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = not sent
    max_tokens: int = 1024  # per turn (max_completion_tokens)
    request_timeout_s: int = 660  # per LLM request (from_config: engine.timeout_s + 60)
    stuck_detection: bool = True  # the SDK's stuck detector (the official runner keeps it on)
    no_change_timeout_s: int | None = None  # terminal "no new output" timeout; None = SDK default (30 s)
    max_command_s: float = 600.0  # wall time of one terminal call; past it the command is stopped
    cli_mode: bool = True  # the SDK system prompt's CLI mode, as the official runner sets it
    profile: str = "openhands"  # "openhands": the SDK's prompt; "compact": short prompt and tool texts

    @classmethod
    def from_config(cls, cfg, **overrides) -> AgentSettings:
        """From a ``harness.config.HarnessConfig``: agent.*, sampling.*, proxy.tool_format, the proxy's bearer token
        (proxy.token / $SAO_PROXY_TOKEN) as the api key, engine.timeout_s + 60 as the request timeout (the
        proxy reports an engine timeout first); ``overrides`` win."""
        a, s = cfg.agent, cfg.sampling
        kw: dict[str, Any] = dict(
            model=a.model, max_iterations=a.max_iterations, max_nudges=a.max_nudges,
            stuck_detection=a.stuck_detection, no_change_timeout_s=a.no_change_timeout_s,
            max_command_s=a.max_command_s, profile=a.profile, native_tool_calling=cfg.proxy.tool_format == "native",
            temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_tokens=s.max_tokens,
            request_timeout_s=int(cfg.engine.timeout_s) + 60)
        token = cfg.proxy.resolved_token()
        if token:
            kw["api_key"] = token
        return cls(**{**kw, **overrides})


# ---------------------------------------------------------------------------------------- result

class ErrorKind(StrEnum):
    """Why an agent loop ended on an error (``AgentResult.status`` maps each onto a trace Status)."""

    INFRA = auto()  # an LLM, proxy, HTTP or sandbox failure
    CONTEXT = auto()  # the context window (or the episode's token budget) overflowed
    AGENT = auto()  # anything else


@dataclass
class AgentResult:
    """How an episode's agent loop ended."""

    finished: bool  # the agent called `finish`
    iterations: int  # LLM requests made (= agent turns; a final failed request included)
    nudges: int  # "please continue" messages sent
    hit_max_iterations: bool
    error: str | None = None  # reason, when the loop ended on an error
    error_kind: ErrorKind | None = None
    stuck: bool = False  # the SDK's stuck detector ended the run
    llm_response_ids: list[str] = field(default_factory=list)  # ids of completions the SDK accepted, in order
    events: dict[str, Any] = field(default_factory=dict)  # summary: counts, tool calls, errors
    finish_message: str | None = None
    duration_s: float = 0.0
    conversation_id: str | None = None
    tools_start_s: float = 0.0  # starting the sandbox tools (the terminal's shell in the container) before turn 1

    @property
    def status(self) -> Status:
        """The trace status this end maps to."""
        if self.error_kind == ErrorKind.INFRA:
            return Status.INFRA_ERROR
        if self.error_kind == ErrorKind.CONTEXT:
            return Status.TRUNCATED_CONTEXT
        if self.error_kind == ErrorKind.AGENT:
            return Status.AGENT_ERROR
        if self.hit_max_iterations:
            return Status.TRUNCATED_TURNS
        return Status.OK

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "status": self.status}


def classify_error(exc: BaseException) -> ErrorKind:
    """``infra`` for LLM/proxy/HTTP and sandbox/Docker failures, ``context`` for a context-window
    overflow, ``agent`` for anything else."""
    sdk = load_sdk()
    e = exc
    if isinstance(e, sdk["ConversationRunError"]) and e.__cause__ is not None:
        e = e.__cause__
    llm_exc = sdk["llm_exc"]
    if isinstance(e, (llm_exc.LLMContextWindowExceedError, llm_exc.LLMContextWindowTooSmallError)):
        return ErrorKind.CONTEXT
    if "context_length_exceeded" in str(e):  # the proxy's 400 for a prompt over the episode's token budget
        return ErrorKind.CONTEXT
    if isinstance(e, (llm_exc.LLMError, sdk["SandboxUnavailable"])):
        return ErrorKind.INFRA
    return ErrorKind.INFRA if isinstance(e, sdk["system_errors"]) else ErrorKind.AGENT


def _error_reason(exc: BaseException) -> str:
    e = exc
    if isinstance(e, load_sdk()["ConversationRunError"]) and e.__cause__ is not None:
        e = e.__cause__
    return f"{type(e).__name__}: {str(e).strip()[:1000]}"


# ------------------------------------------------------------------------------------------ build

def build_llm(base_url: str, *, episode_id: str, task_id: str, settings: AgentSettings | None = None,
              extra_headers: dict[str, str] | None = None):
    """``openhands.sdk.LLM`` at ``base_url`` with the episode headers and the RL sampling settings."""
    sdk = load_sdk()
    s = settings or AgentSettings()
    return sdk["EpisodeLLM"](
        model=s.model, base_url=base_url, api_key=s.api_key, usage_id="agent",
        num_retries=0, timeout=s.request_timeout_s,
        temperature=s.temperature, top_p=s.top_p, max_output_tokens=s.max_tokens,
        litellm_extra_body={"top_k": s.top_k} if s.top_k else {},
        native_tool_calling=s.native_tool_calling,
        extra_headers={"X-Episode-Id": episode_id, "X-Task-Id": task_id, **(extra_headers or {})},
        reasoning_effort=None, caching_prompt=False, stream=False,
        input_cost_per_token=0.0, output_cost_per_token=0.0,
        # A model the SDK does not know: send sampling params, no reasoning effort / cache keys.
        capability_overrides={"supports_reasoning_effort": False, "supports_sampling_params": True,
                              "supports_prompt_cache_key": False, "supports_prompt_cache": False,
                              "supports_prompt_cache_retention": False, "supports_vision": False,
                              "supports_stop_words": True, "supports_responses_api": False},
    )


def build_agent(llm, tools, settings: AgentSettings | None = None):
    """The SDK ``Agent``: no condenser, ``terminal`` + ``file_editor`` in the sandbox, ``finish`` + ``think``."""
    sdk = load_sdk()
    s = settings or AgentSettings()
    if s.profile == "compact":  # the same tools (finish and think among the specs) with short texts
        return sdk["Agent"](llm=llm, tools=tools.tool_specs(profile="compact"), condenser=None,
                            include_default_tools=[], system_prompt=COMPACT_SYSTEM_PROMPT)
    if s.profile != "openhands":
        raise ValueError(f"unknown agent profile {s.profile!r} (expected openhands or compact)")
    return sdk["Agent"](llm=llm, tools=tools.tool_specs(), condenser=None,
                        include_default_tools=["FinishTool", "ThinkTool"],
                        system_prompt_kwargs={"cli_mode": s.cli_mode})


def build_conversation(agent, workspace: str, settings: AgentSettings | None = None, callbacks=None):
    """A ``LocalConversation`` (in-memory, no visualizer); ``workspace`` is an empty host directory."""
    sdk = load_sdk()
    s = settings or AgentSettings()
    return sdk["LocalConversation"](agent=agent, workspace=workspace, persistence_dir=None,
                                    max_iteration_per_run=s.max_iterations, stuck_detection=s.stuck_detection,
                                    visualizer=None, callbacks=list(callbacks or []), delete_on_close=True)


# -------------------------------------------------------------------------------------------- run

def _target(sandbox):
    SandboxTarget = load_sdk()["SandboxTarget"]
    if isinstance(sandbox, SandboxTarget):
        return sandbox
    if hasattr(sandbox, "container_id"):  # envs.sandbox.Sandbox
        return SandboxTarget.from_sandbox(sandbox)
    if isinstance(sandbox, str):
        return SandboxTarget(container=sandbox)
    raise TypeError(f"run_agent: sandbox must be a SandboxTarget, an envs Sandbox or a container id, "
                    f"not {type(sandbox).__name__}")


def _completions(llm) -> list[str]:
    """Ids of the completions the SDK accepted, in order (from the LLM's own metrics: the conversation's
    registry tracks only plain ``LLM`` objects)."""
    return [r.response_id for r in llm.metrics.response_latencies]


def _requests(llm) -> int:
    """LLM requests made so far (malformed replies and a final failed request included)."""
    return len(llm._requests)


def _last_agent_turn(events, sdk) -> str:
    """'finish', 'message' (a reply without tool call), 'action' or 'none' for the latest agent turn."""
    for e in reversed(events):
        if isinstance(e, sdk["ActionEvent"]):
            return "finish" if isinstance(e.action, sdk["FinishAction"]) else "action"
        if isinstance(e, sdk["MessageEvent"]) and e.source == "agent":
            return "message"
    return "none"


def summarize_events(events, sdk=None) -> dict[str, Any]:
    """Counts per event type and per tool, agent errors and conversation error codes."""
    sdk = sdk or load_sdk()
    counts: dict[str, int] = {}
    tools: dict[str, int] = {}
    agent_errors, conv_errors, no_tool_replies = 0, [], 0
    for e in events:
        counts[type(e).__name__] = counts.get(type(e).__name__, 0) + 1
        if isinstance(e, sdk["ActionEvent"]):
            tools[e.tool_name] = tools.get(e.tool_name, 0) + 1
        elif isinstance(e, sdk["AgentErrorEvent"]):
            agent_errors += 1
        elif isinstance(e, sdk["ConversationErrorEvent"]):
            conv_errors.append(e.code)
        elif isinstance(e, sdk["MessageEvent"]) and e.source == "agent":
            no_tool_replies += 1
    return {"counts": counts, "tool_calls": tools, "agent_errors": agent_errors,
            "no_tool_call_replies": no_tool_replies, "conversation_errors": conv_errors}


def run_agent(sandbox, *, base_url: str, instruction: str, episode_id: str, task_id: str,
              settings: AgentSettings | None = None, extra_headers: dict[str, str] | None = None,
              callbacks=None, tools=None) -> AgentResult:
    """Run one episode's agent loop in ``sandbox`` against the LLM at ``base_url``; see the module doc.

    ``tools``: ready-made tools (an object with ``tool_specs()`` and ``close()``, closed here) instead of
    ``SandboxTools`` for ``sandbox`` (then ``sandbox`` may be None).
    """
    sdk = load_sdk()
    s = settings or AgentSettings()
    t0 = time.monotonic()
    if tools is None:
        tools = sdk["SandboxTools"](_target(sandbox), no_change_timeout_seconds=s.no_change_timeout_s,
                                    max_command_s=s.max_command_s)
    tools_start_s = time.monotonic() - t0
    workspace = tempfile.mkdtemp(prefix="sao-agent-ws-")
    conv = llm = None
    out: dict[str, Any] = dict(finished=False, hit_max_iterations=False, stuck=False, nudges=0, error=None,
                               error_kind=None, finish_message=None)
    try:
        try:
            llm = build_llm(base_url, episode_id=episode_id, task_id=task_id, settings=s,
                            extra_headers=extra_headers)
            llm._abort = lambda: getattr(tools, "failure", None)  # a sandbox failure ends the run before the next turn
            conv = build_conversation(build_agent(llm, tools, s), workspace, s, callbacks)
            conv.send_message(instruction)
            _drive(conv, llm, s, sdk, out)
        except Exception as e:  # building the agent or sending a message failed
            out.update(error=_error_reason(e), error_kind=classify_error(e))
        failure = getattr(tools, "failure", None)
        if failure is not None and out["error_kind"] != ErrorKind.INFRA:  # e.g. it finished as the sandbox died
            out.update(error=_error_reason(failure), error_kind=ErrorKind.INFRA, finished=False)
        events = list(conv.state.events) if conv is not None else []
        summary = summarize_events(events, sdk) if events else {}
        summary["terminal_sessions"] = getattr(getattr(tools, "terminal", None), "sessions_started", 0)
        summary["file_editor_calls"] = getattr(getattr(tools, "file_editor", None), "calls", 0)
        return AgentResult(**out, iterations=_requests(llm) if llm is not None else 0,
                           llm_response_ids=_completions(llm) if llm is not None else [], events=summary,
                           duration_s=time.monotonic() - t0, tools_start_s=tools_start_s,
                           conversation_id=str(conv.state.id) if conv is not None else None)
    finally:
        if conv is not None:
            try:
                conv.close()
            except Exception:
                pass
        tools.close()
        shutil.rmtree(workspace, ignore_errors=True)


def _drive(conv, llm, s: AgentSettings, sdk, out: dict[str, Any]) -> None:
    """Run the conversation to its end, nudging replies without a tool call; record the end in ``out``."""
    Execution = sdk["Status"]  # the SDK's execution status of the conversation
    while True:
        remaining = s.max_iterations - _requests(llm)
        if remaining <= 0:
            out["hit_max_iterations"] = True
            return
        conv.max_iteration_per_run = remaining
        try:
            conv.run()
        except Exception as e:  # ConversationRunError: LLM/proxy, sandbox or SDK failure
            out.update(error=_error_reason(e), error_kind=classify_error(e))
            return
        status = conv.state.execution_status
        events = list(conv.state.events)
        if status == Execution.FINISHED:
            turn = _last_agent_turn(events, sdk)
            if turn == "finish":
                out.update(finished=True, finish_message=_finish_message(events, sdk))
                return
            if turn == "message" and out["nudges"] < s.max_nudges:
                if s.max_iterations - _requests(llm) <= 0:
                    out["hit_max_iterations"] = True
                    return
                conv.send_message(nudge_text(out["nudges"]))
                out["nudges"] += 1
                continue
            return  # out of nudges
        if status == Execution.STUCK:
            out["stuck"] = True
        elif status == Execution.ERROR:
            codes = [e.code for e in events if isinstance(e, sdk["ConversationErrorEvent"])]
            if codes and codes[-1] == "MaxIterationsReached":
                out["hit_max_iterations"] = True
            else:
                out.update(error=f"conversation error: {codes[-1] if codes else 'unknown'}", error_kind=ErrorKind.AGENT)
        return


def _finish_message(events, sdk) -> str | None:
    for e in reversed(events):
        if isinstance(e, sdk["ActionEvent"]) and isinstance(e.action, sdk["FinishAction"]):
            return getattr(e.action, "message", None)
    return None
