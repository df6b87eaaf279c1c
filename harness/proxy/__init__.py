"""Token-exact OpenAI-compatible proxy: one session per episode, token ids in, token ids out.

- ``messages``: request messages normalized for the chat template, ``ProxyError``;
- ``parsers``: tool-call and reasoning parsers by vLLM's names (hermes, qwen3_coder, llama3_json, glm45;
  qwen3, glm45, deepseek_r1), the defaults a template implies;
- ``template``: the chat template (full render, the observation after a reply, anchored on the end of
  that reply), the continuability check and the drift check;
- ``tool_support``: whether a chat template can serve ``proxy.tool_format`` (renders tools, a parser in
  force), asked before the first episode (pre-flight, ``sao config``, ``sao doctor``), with the fix;
- ``session``: one episode's token bookkeeping, and the token invariant the trace keeps;
- ``server``: the FastAPI server (``ProxyServer``): loopback only unless a bearer token guards it
  (``proxy.token`` / ``$SAO_PROXY_TOKEN``); bodies over ``proxy.max_request_bytes`` are a 413.

With ``tools`` in a request, the tool calls in a reply (``proxy.tool_parser``) become OpenAI ``tool_calls``
(malformed: the whole text is a plain reply); without, the text passes through. Reasoning
(``proxy.reasoning_parser``) comes back as ``reasoning_content``; the trace keeps every sampled token.
A context budget (``proxy.context_budget``) clips ``max_tokens``; a reply cut by it marks the episode
``truncated_context``; a prompt already over it is a 400 ``context_length_exceeded``.

In-process: ``ProxyServer(engine, tokenizer, cfg).start() -> base_url`` (``http://127.0.0.1:PORT/v1``),
``.session(id)``, ``.close_episode(id) -> Trajectory``, ``.stop()``.
"""
from sao_harness.harness.proxy.messages import ProxyError, message_key, normalize_message
from sao_harness.harness.proxy.parsers import REASONING_PARSERS, TOOL_PARSERS, default_parsers, parse_tool_calls
from sao_harness.harness.proxy.server import (
    DEFAULT_EPISODE,
    HEADER_EPISODE,
    HEADER_TASK,
    ProxyServer,
    UnknownEpisode,
    check_loopback,
)
from sao_harness.harness.proxy.session import Session
from sao_harness.harness.proxy.template import ChatTemplate, TemplateError, drift_report

__all__ = [
    "DEFAULT_EPISODE",
    "REASONING_PARSERS",
    "TOOL_PARSERS",
    "HEADER_EPISODE",
    "HEADER_TASK",
    "ChatTemplate",
    "TemplateError",
    "ProxyError",
    "ProxyServer",
    "Session",
    "UnknownEpisode",
    "check_loopback",
    "default_parsers",
    "drift_report",
    "message_key",
    "normalize_message",
    "parse_tool_calls",
]
