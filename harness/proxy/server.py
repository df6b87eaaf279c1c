"""The OpenAI-compatible FastAPI server: sessions by episode id; loopback unless a token guards it.

Endpoints: ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /health``,
``POST /episodes/{id}/close``. The episode comes from the ``X-Episode-Id`` header (missing: the episode
``default``), the task from ``X-Task-Id`` (default: the episode id). Errors are OpenAI-shaped JSON
(``ProxyError``); a bug is answered as a 500 and the server keeps serving.

Guards, before any route: with a token (``proxy.token``, else ``$SAO_PROXY_TOKEN``) every request must
carry ``Authorization: Bearer <token>`` (else 401); a body over ``proxy.max_request_bytes`` is a 413,
refused from its ``Content-Length`` before it is read, a chunked one as soon as it passes the limit.

Concurrency: a turn (``Session.complete``, blocking on the engine) runs in a worker thread, at most
``max_turns_in_flight = max(rollout.workers, MIN_TURN_THREADS)`` at once (a limiter of the proxy's own,
not anyio's default pool of 40), so every rollout worker's turn can be in the engine at the same time.
"""
from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import threading
import time

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from sao_harness.core.errors import UserError
from sao_harness.harness.config import TOKEN_ENV, context_budget
from sao_harness.harness.engines.registry import engine_spec
from sao_harness.harness.proxy.messages import ProxyError
from sao_harness.harness.proxy.parsers import parsers_from_config
from sao_harness.harness.proxy.session import Session, SessionSetup, request_sampling
from sao_harness.harness.proxy.template import template_from_config
from sao_harness.harness.trace import Trajectory

log = logging.getLogger(__name__)

HEADER_EPISODE = "x-episode-id"
HEADER_TASK = "x-task-id"
DEFAULT_EPISODE = "default"
MIN_TURN_THREADS = 40  # anyio's default pool: what `sao serve` with few rollout workers keeps


class UnknownEpisode(ProxyError, KeyError):
    def __init__(self, episode_id: str):
        super().__init__(404, f"unknown episode {episode_id!r} (no open session with that X-Episode-Id)",
                         "not_found_error", "unknown_episode")


def check_loopback(host: str, token: str | None = None) -> None:
    """The bind rule: a loopback host always; any other host (routable, ``0.0.0.0``, a name) only with
    a token, else a ``UserError`` naming the host and the key to set."""
    if host == "localhost" or token:
        return
    try:
        ok = ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = False
    if not ok:
        raise UserError(f"host {host!r} is not a loopback address: binding it needs a bearer token "
                        f"(set proxy.token or ${TOKEN_ENV}), or use 127.0.0.1, ::1 or localhost")


class _Guard:
    """ASGI middleware: bearer token (401) and the declared body size (413) of every request, answered
    before the app sees it. A chunked body is bounded where it is read (``ProxyServer._read_body``)."""

    def __init__(self, app, token: str | None, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes
        self.token = token.encode() if token else None

    def authorized(self, header: bytes) -> bool:
        scheme, _, given = header.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.token)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope["headers"])  # lower-case byte names; a repeated header: its last value
            if self.token is not None and not self.authorized(headers.get(b"authorization", b"")):
                return await _answer(send, ProxyError(401, "missing or wrong bearer token (Authorization: "
                                                           "Bearer <proxy.token>)", "authentication_error",
                                                      "invalid_api_key"), {b"www-authenticate": b"Bearer"})
            declared = headers.get(b"content-length", b"")
            if declared.isdigit() and int(declared) > self.max_bytes:
                return await _answer(send, too_large(self.max_bytes), {b"connection": b"close"})
        await self.app(scope, receive, send)


def too_large(limit: int) -> ProxyError:
    return ProxyError(413, f"request body exceeds proxy.max_request_bytes ({limit} bytes)",
                      "invalid_request_error", "request_too_large")


async def _answer(send, e: ProxyError, extra: dict[bytes, bytes]) -> None:
    body = json.dumps(e.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               *extra.items()]
    await send({"type": "http.response.start", "status": e.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


KEEP_ALIVE_S = 120  # seconds an idle client connection stays open (see ProxyServer.start)


class ProxyServer:
    """The proxy for one engine: sessions by episode id, a FastAPI app, an optional trace store."""

    def __init__(self, engine, tokenizer, cfg, store=None, model_name: str | None = None,
                 full_history_check: bool | None = None):
        self.engine, self.cfg, self.store = engine, cfg, store
        # see Session._extends; default: proxy.full_history_check
        self.full_history_check = cfg.proxy.full_history_check if full_history_check is None else full_history_check
        self.template = template_from_config(tokenizer, cfg.proxy)
        self.tool_parser, self.reasoning_parser = parsers_from_config(self.template, cfg.proxy)
        fits = engine_spec(cfg.engine.kind).tool_parsers  # None: any (a model writes what its template teaches)
        if fits is not None and self.tool_parser is not None and self.tool_parser not in fits:
            raise UserError(f"proxy.tool_parser: engine.kind={cfg.engine.kind} writes {' or '.join(fits)} tool "
                            f"calls, but the parser in force is {self.tool_parser}: set proxy.tool_parser="
                            f"{fits[0]}, or use a model whose chat template teaches it")
        self.tokenizer_path = str(getattr(tokenizer, "name_or_path", "") or "")
        self.model_name = model_name or cfg.model.path
        budget = context_budget(cfg)  # proxy.context_budget, or the model's length if shorter
        self.context_budget, self.context_budget_source = budget.tokens, budget.source
        if budget.warning:
            log.warning("%s", budget.warning)
        self.max_turns_in_flight = max(cfg.rollout.workers, MIN_TURN_THREADS)
        self._turn_limiter = anyio.CapacityLimiter(self.max_turns_in_flight)
        self.max_request_bytes = cfg.proxy.max_request_bytes
        self.token = cfg.proxy.resolved_token()  # None: no authentication
        self.sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._server = None
        self._thread: threading.Thread | None = None
        self.base_url: str | None = None
        self.setup = SessionSetup(
            engine=engine, template=self.template, tool_parser=self.tool_parser,
            reasoning_parser=self.reasoning_parser, model_name=self.model_name, tokenizer_path=self.tokenizer_path,
            context_budget=self.context_budget, context_budget_source=self.context_budget_source,
            full_history_check=self.full_history_check, sampling=lambda body: request_sampling(cfg, body))
        self.app = self._build_app()

    # sessions
    def session(self, episode_id: str, task_id: str | None = None) -> Session:
        with self._lock:
            s = self.sessions.get(episode_id)
            if s is None:
                s = self.sessions[episode_id] = Session(self.setup, episode_id, task_id)
            return s

    def close_episode(self, episode_id: str) -> Trajectory:
        """End an episode: its trajectory (not stored; see ``close_and_store``). Unknown -> UnknownEpisode."""
        with self._lock:
            s = self.sessions.pop(episode_id, None)
        if s is None:
            raise UnknownEpisode(episode_id)
        return s.trajectory()

    def close_and_store(self, episode_id: str):
        """End an episode and write its trajectory to the store: ``(trajectory, shard path or None)``."""
        traj = self.close_episode(episode_id)
        return traj, (self.store.write([traj]) if self.store is not None else None)

    def close_all(self) -> list:
        """Close every open episode that has something to record; store them. Returns (traj, shard) pairs."""
        out = []
        for eid, s in list(self.sessions.items()):
            if s.turns == 0 and not s.errors:
                self.sessions.pop(eid, None)  # only ever sent malformed requests: nothing to record
            else:
                out.append(self.close_and_store(eid))
        return out

    # HTTP
    async def _read_body(self, request: Request) -> bytes:
        """The request body, read chunk by chunk; past ``max_request_bytes`` -> a 413 ``ProxyError``."""
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_request_bytes:
                raise too_large(self.max_request_bytes)
            chunks.append(chunk)
        return b"".join(chunks)

    def _build_app(self):
        app = FastAPI(title="sao-harness proxy", docs_url=None, redoc_url=None)

        def error(e: ProxyError) -> JSONResponse:  # a 413 leaves the body unread: close the connection
            return JSONResponse(e.body(), status_code=e.status, headers={"connection": "close"} if e.status == 413
                                else None)

        @app.post("/v1/chat/completions")
        async def chat_completions(request: Request):
            try:
                try:
                    body = json.loads(await self._read_body(request))
                except (json.JSONDecodeError, UnicodeDecodeError) as e:
                    raise ProxyError(400, f"request body is not valid JSON: {e}") from None
                if not isinstance(body, dict):
                    raise ProxyError(400, "request body must be a JSON object")
                session = self.session(request.headers.get(HEADER_EPISODE) or DEFAULT_EPISODE,
                                       request.headers.get(HEADER_TASK))
                return JSONResponse(await anyio.to_thread.run_sync(session.complete, body,
                                                                   limiter=self._turn_limiter))
            except ProxyError as e:
                return error(e)
            except Exception as e:  # a bug must not take the server down: answer it as a 500
                return error(ProxyError(500, f"proxy error: {type(e).__name__}: {e}", "server_error", "internal"))

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                                "owned_by": "sao-harness"}]}

        @app.get("/health")
        async def health():
            eng = self.engine.health()
            return JSONResponse({"ok": bool(eng.get("ok")), "engine": eng, "open_episodes": len(self.sessions)},
                                status_code=200 if eng.get("ok") else 503)

        @app.post("/episodes/{episode_id}/close")
        async def close(episode_id: str):
            try:
                traj, shard = await run_in_threadpool(self.close_and_store, episode_id)
            except ProxyError as e:
                return error(e)
            except Exception as e:
                return error(ProxyError(500, f"closing episode {episode_id!r} failed: {type(e).__name__}: {e}",
                                        "server_error", "internal"))
            return {"episode_id": episode_id, "traj_id": traj.traj_id, "shard": str(shard) if shard else None,
                    "status": traj.status, "turns": traj.turns, "num_tokens": traj.num_tokens,
                    "breaks": traj.breaks, "drift": traj.metadata.get("drift")}

        app.add_middleware(_Guard, token=self.token, max_bytes=self.max_request_bytes)
        return app

    def start(self, host: str | None = None, port: int = 0, timeout: float = 30.0) -> str:
        """Serve in a background thread on ``host`` (default ``cfg.proxy.host``; see ``check_loopback``) and
        ``port`` (0 = a free one); return the OpenAI base URL ``http://host:port/v1``."""
        import uvicorn  # lazy: the server dependency, only needed to serve over HTTP

        host = host or self.cfg.proxy.host
        check_loopback(host, self.token)
        # uvicorn binds the socket itself: a socket handed in with ``sockets=`` costs ~40 ms per keep-alive request.
        # An idle connection stays open past any client's keep-alive expiry (httpx, hence the agent's client: 5 s,
        # uvicorn's own default too): the client drops it first, so a request never lands on a connection the
        # server is closing ("Connection error." after a tool call of ~5 s, seen with 128 episodes at once).
        self._server = uvicorn.Server(uvicorn.Config(self.app, host=host, port=port, log_level="warning",
                                                     access_log=False, lifespan="off",
                                                     timeout_keep_alive=KEEP_ALIVE_S))
        self._thread = threading.Thread(target=self._server.run, name="sao-proxy", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"proxy did not start on {host}:{port} within {timeout:g}s")
            time.sleep(0.01)
        bound = self._server.servers[0].sockets[0].getsockname()[1]
        self.base_url = f"http://{'[' + host + ']' if ':' in host else host}:{bound}/v1"
        return self.base_url

    def stop(self, timeout: float = 10.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._thread.join(timeout=timeout)
            self._server = self._thread = None
