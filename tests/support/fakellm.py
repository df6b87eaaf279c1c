"""A scripted fake OpenAI-compatible chat server for the agent tests and bench (plus its own checks).

``FakeLLM(replies)`` serves ``POST /v1/chat/completions`` on 127.0.0.1 (a free port) from a thread and
answers each request with the next scripted reply; every request (JSON body + headers) is recorded.
A reply is one of:
- ``tool(name, **args)``: a native ``tool_calls`` reply (what a native-mode proxy returns);
- ``text("...")``: plain assistant content (prompt mode: ``<function=...>`` blocks; or a no-tool reply);
- ``http_error(status, message)``: an HTTP error (an engine/proxy failure);
- a callable ``(request_json) -> reply`` for replies that depend on the request.
When the script runs out the server returns ``exhausted`` (default: an HTTP 500 naming it).
Like a real server it honours ``stop``: text content is cut before the first stop string.
"""
from __future__ import annotations

import itertools
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


@dataclass
class Reply:
    content: str | None = None
    tool_calls: list[tuple[str, dict]] = field(default_factory=list)
    status: int = 200
    error: str = ""
    delay_s: float = 0.0


def tool(name: str, **args) -> Reply:
    return Reply(tool_calls=[(name, args)])


def text(content: str) -> Reply:
    return Reply(content=content)


def http_error(status: int = 500, message: str = "engine failure") -> Reply:
    return Reply(status=status, error=message)


def prompt_call(name: str, **args) -> Reply:
    """A prompt-mode (non-native) tool call as a model writes it, up to the ``</function`` stop."""
    body = "".join(f"<parameter={k}>{v if isinstance(v, str) else json.dumps(v)}</parameter>\n"
                   for k, v in args.items())
    return Reply(content=f"<function={name}>\n{body}</function>")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeLLM:
    """Scripted OpenAI-compatible server; use as a context manager. ``requests`` holds what it got."""

    def __init__(self, replies: list[Reply | Callable[[dict], Reply]] | None = None,
                 exhausted: Reply | None = None, model: str = "fake-policy"):
        self.replies = list(replies or [])
        self.exhausted = exhausted or http_error(500, "fake LLM: script exhausted")
        self.model = model
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.other_paths: list[str] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.port = _free_port()
        self._server = None
        self._thread = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def add(self, *replies) -> None:
        with self._lock:
            self.replies.extend(replies)

    def _next(self, body: dict) -> Reply:
        with self._lock:
            r = self.replies.pop(0) if self.replies else self.exhausted
        return r(body) if callable(r) else r

    def _completion(self, body: dict, r: Reply) -> dict:
        n = next(self._ids)
        msg: dict[str, Any] = {"role": "assistant", "content": r.content}
        finish = "stop"
        if r.tool_calls:
            msg["tool_calls"] = [
                {"id": f"call_{n}_{i}", "type": "function",
                 "function": {"name": name, "arguments": json.dumps(args)}}
                for i, (name, args) in enumerate(r.tool_calls)]
            finish = "tool_calls"
        if isinstance(msg["content"], str):
            stops = body.get("stop") or []
            for s in [stops] if isinstance(stops, str) else stops:
                if s and s in msg["content"]:
                    msg["content"] = msg["content"].split(s, 1)[0]
        return {"id": f"chatcmpl-fake-{n}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", self.model),
                "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}

    def _app(self):
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            body = await request.json()
            with self._lock:
                self.requests.append(body)
                self.headers.append({k.lower(): v for k, v in request.headers.items()})
            r = self._next(body)
            if r.delay_s:
                time.sleep(r.delay_s)
            if r.status != 200:
                return JSONResponse({"error": {"message": r.error, "type": "server_error"}}, status_code=r.status)
            return JSONResponse(self._completion(body, r))

        @app.api_route("/{path:path}", methods=["GET", "POST"])
        async def other(path: str):
            self.other_paths.append(path)
            return JSONResponse({"error": "not found"}, status_code=404)

        return app

    def __enter__(self) -> FakeLLM:
        import uvicorn  # lazy: the server starts only in the tests that use it

        config = uvicorn.Config(self._app(), host="127.0.0.1", port=self.port, log_level="error",
                                lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake LLM server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=5)


# ---------------------------------------------------------------- checks of the fake itself
