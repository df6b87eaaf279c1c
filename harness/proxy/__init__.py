"""Token-exact OpenAI-compatible proxy: one session per episode, token ids in, token ids out.

- ``messages``: request messages normalized for the chat template, Hermes tool calls parsed, ``ProxyError``;
- ``template``: the chat template (full render, continuation, owed end-of-turn text) and the drift check;
- ``session``: one episode's token bookkeeping, and the token invariant the trace keeps;
- ``server``: the FastAPI server (``ProxyServer``): loopback only unless a bearer token guards it
  (``proxy.token`` / ``$SAO_PROXY_TOKEN``); bodies over ``proxy.max_request_bytes`` are a 413.

With ``tools`` in a request, Hermes ``<tool_call>{"name", "arguments"}</tool_call>`` blocks in a reply
become OpenAI ``tool_calls`` (malformed JSON: the whole text is a plain reply); without, the text passes
through. A context budget (``proxy.context_budget``) clips ``max_tokens``; a reply cut by it marks the
episode ``truncated_context``; a prompt already over it is a 400 ``context_length_exceeded``.

In-process: ``ProxyServer(engine, tokenizer, cfg).start() -> base_url`` (``http://127.0.0.1:PORT/v1``),
``.session(id)``, ``.close_episode(id) -> Trajectory``, ``.stop()``.
"""
from harness.proxy.messages import (
    ProxyError,
    message_key,
    normalize_message,
    parse_tool_calls,
)
from harness.proxy.server import (
    DEFAULT_EPISODE,
    HEADER_EPISODE,
    HEADER_TASK,
    ProxyServer,
    UnknownEpisode,
    check_loopback,
)
from harness.proxy.session import Session
from harness.proxy.template import ChatTemplate, drift_report

__all__ = [
    "DEFAULT_EPISODE",
    "HEADER_EPISODE",
    "HEADER_TASK",
    "ChatTemplate",
    "ProxyError",
    "ProxyServer",
    "Session",
    "UnknownEpisode",
    "check_loopback",
    "drift_report",
    "message_key",
    "normalize_message",
    "parse_tool_calls",
]
