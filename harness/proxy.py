"""Token-exact OpenAI-compatible proxy: one session per episode, token ids in, token ids out.

Endpoints (loopback only): ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /health``,
``POST /episodes/{id}/close``. The episode comes from the ``X-Episode-Id`` header (missing: the
episode ``default``), the task from ``X-Task-Id`` (default: the episode id).

Per episode the session keeps the exact token sequence the model has seen. A turn:
1. checks the request's messages extend what the session saw (same count or more, client messages
   equal, each assistant message the session produced matched by position, role and tool-call ids
   only: clients re-serialize them; per turn at the boundary only, see ``Session._extends``); if not,
   it starts a new sequence from a full render and records a break (``Trajectory.breaks``);
2. renders only the new messages (tool results, user nudges) plus the generation prompt as a
   continuation of the template (``ChatTemplate.continuation``), prefixed by the end-of-turn text the
   previous reply still owes (e.g. ``<|im_end|>`` when the model stopped at a stop string, or only
   ``\\n`` after a sampled ``<|im_end|>``): these are observation tokens; the sampled ids of earlier
   replies are never re-rendered;
3. calls the engine with ``previous ids + observation ids``, records the sampled ids, logprobs and
   versions as an action segment, and answers a chat completion; with ``tools`` in the request,
   Hermes ``<tool_call>{"name", "arguments"}</tool_call>`` blocks become OpenAI ``tool_calls``
   (malformed JSON: the whole text is a plain reply); without, the text passes through.
A context budget (``proxy.context_budget``) clips ``max_tokens``; a reply cut by it marks the
episode ``truncated_context``; a prompt already over it is a 400 ``context_length_exceeded``.
Errors are OpenAI-shaped JSON (``{"error": {"message", "type", "code"}}``); the server keeps serving.

In-process: ``ProxyServer(engine, tokenizer, cfg).start() -> base_url`` (``http://127.0.0.1:PORT/v1``),
``.session(id)``, ``.close_episode(id) -> Trajectory``, ``.stop()``.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import json
import re
import threading
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from harness.drift import drift_report
from harness.engines import EngineTimeout, SamplingParams, sampling_from_config
from harness.engines.protocol import find_stop
from core.errors import UserError
from harness.trace import Segment, Trajectory

HEADER_EPISODE = "x-episode-id"
HEADER_TASK = "x-task-id"
DEFAULT_EPISODE = "default"
_STATUS_RANK = {"ok": 0, "truncated_context": 1, "infra_error": 2}
_TOOL_CALL = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.S)


class ProxyError(Exception):
    """An error answered as OpenAI-shaped JSON with an HTTP status."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code = status, message, type, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": None, "code": self.code}}


class UnknownEpisode(ProxyError, KeyError):
    def __init__(self, episode_id: str):
        super().__init__(404, f"unknown episode {episode_id!r} (no open session with that X-Episode-Id)",
                         "not_found_error", "unknown_episode")


def check_loopback(host: str) -> None:
    """Refuse any host that is not a loopback address: the proxy never binds elsewhere."""
    if host == "localhost":
        return
    try:
        ok = ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = False
    if not ok:
        raise UserError(f"host {host!r} is not a loopback address (use 127.0.0.1, ::1 or localhost)")


# --- messages ---------------------------------------------------------------------------------
def _flatten(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, str):
                parts.append(p)
            elif isinstance(p, dict) and p.get("type", "text") == "text" and isinstance(p.get("text"), str):
                parts.append(p["text"])
            else:
                raise ProxyError(400, f"{where}: only text content parts are supported")
        return "\n".join(parts)
    raise ProxyError(400, f"{where}: content must be a string or a list of text parts")


def _tool_calls(m: dict, where: str) -> list[dict]:
    calls = m.get("tool_calls") or []
    if not isinstance(calls, list):
        raise ProxyError(400, f"{where}: tool_calls must be a list")
    out = []
    for c in calls:
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ProxyError(400, f"{where}: each tool call needs function.name")
        args = fn.get("arguments", "{}")
        out.append({"id": str(c.get("id", "")), "type": "function",
                    "function": {"name": fn["name"], "arguments": args if isinstance(args, str) else json.dumps(args)}})
    return out


def normalize_message(m: Any, i: int) -> dict:
    """A request message as the chat template expects it: string content, OpenAI tool calls."""
    where = f"messages[{i}]"
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise ProxyError(400, f"{where} must be an object with a string 'role'")
    out = {"role": m["role"], "content": _flatten(m.get("content"), where)}
    if m["role"] == "assistant" and m.get("tool_calls"):
        out["tool_calls"] = _tool_calls(m, where)
    if m["role"] == "tool":
        out["tool_call_id"] = str(m.get("tool_call_id", ""))
        if m.get("name"):
            out["name"] = m["name"]
    return out


def message_key(m: Any, i: int) -> tuple:
    """What must be equal for a client message to count as unchanged (cheap: no template work)."""
    n = normalize_message(m, i)
    calls = tuple((c["id"], c["function"]["name"], c["function"]["arguments"]) for c in n.get("tool_calls", ()))
    return n["role"], n["content"], n.get("tool_call_id"), calls


def parse_tool_calls(text: str) -> tuple[str | None, list[dict] | None]:
    """Hermes ``<tool_call>`` blocks -> (content, OpenAI tool_calls); any malformed block -> (text, None)."""
    if "<tool_call>" not in text:
        return text, None
    calls = []
    for m in _TOOL_CALL.finditer(text):
        if not m.group(2):
            return text, None  # unterminated block
        try:
            obj = json.loads(m.group(1).strip())
        except json.JSONDecodeError:
            return text, None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return text, None
        args = obj.get("arguments", {})
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": obj["name"],
                                   "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)}})
    content = _TOOL_CALL.sub("", text).strip()
    return content or None, calls


# --- the chat template ------------------------------------------------------------------------
class ChatTemplate:
    """The tokenizer's chat template, and the two pieces the proxy derives from it."""

    PROBE = "\u2063sao-probe\u2063"

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self._lock = threading.Lock()  # sessions run in several threads; a fast tokenizer may not be re-entrant
        probe = self.render([{"role": "user", "content": "u"}, {"role": "assistant", "content": self.PROBE}], None, False)
        if self.PROBE not in probe:
            raise ValueError("chat template does not render assistant content verbatim")
        self.turn_end = probe[probe.index(self.PROBE) + len(self.PROBE):]  # e.g. "<|im_end|>\n"
        self.eos_ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        self.eos_text = tokenizer.eos_token or ""
        self._base_cache: dict[tuple, str] = {}

    def render(self, messages: list[dict], tools: list | None, add_generation_prompt: bool) -> str:
        with self._lock:
            return self.tok.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                add_generation_prompt=add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        with self._lock:
            return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        with self._lock:
            return self.tok.decode(ids, skip_special_tokens=False)

    def owed_turn_end(self, reply_ids: list[int]) -> str:
        """The end-of-turn text the template puts after a reply that was sampled as ``reply_ids``."""
        if reply_ids and reply_ids[-1] in self.eos_ids and self.eos_text and self.turn_end.startswith(self.eos_text):
            return self.turn_end[len(self.eos_text):]
        return self.turn_end

    def continuation(self, system: dict | None, new: list[dict], tools: list | None, tools_key: str | None) -> str:
        """The text of ``new`` messages + generation prompt, rendered after an assistant turn.

        Renders ``base`` = [system?, user, assistant] with and without ``new`` and takes the suffix:
        the template's grouping (consecutive tool results in one turn) and role headers come out as in
        a full render, at a cost independent of the episode's length.
        """
        base = ([system] if system else []) + [{"role": "user", "content": "."}, {"role": "assistant", "content": "."}]
        key = (system["content"] if system else None, tools_key)
        head = self._base_cache.get(key)
        if head is None:
            head = self.render(base, tools, False)
            with self._lock:
                if len(self._base_cache) >= 64:
                    self._base_cache.clear()
                self._base_cache[key] = head
        full = self.render(base + new, tools, True)
        if not full.startswith(head):
            raise ProxyError(500, "the chat template does not render new messages as an append-only continuation",
                             "server_error", "template_not_append_only")
        return full[len(head):]


# --- sessions ---------------------------------------------------------------------------------
class Session:
    """One episode's token sequence and trace. ``complete`` is one turn; calls are serialized."""

    def __init__(self, proxy: "ProxyServer", episode_id: str, task_id: str | None):
        self.proxy, self.episode_id, self.task_id = proxy, episode_id, task_id or episode_id
        self.lock = threading.Lock()
        self.segments: list[Segment] = []
        self.n_tokens = 0  # over all sequences
        self.seq: list[int] = []  # the current sequence (since the last break)
        # per message of the current sequence:
        self.history: list[tuple] = []  # ("client", raw dict) | ("produced", tool-call ids of the reply)
        self.final: list[dict] = []  # normalized (a produced reply: as the client resent it, else ours)
        self.tools_key: str | None = None
        self.tools: list | None = None
        self.system: dict | None = None
        self.owed = ""  # end-of-turn text the last reply still owes
        self.status = "ok"
        self.breaks: list[int] = []
        self.turns = 0
        self.completion_ids: list[str] = []
        self.sampling: list[dict] = []
        self.errors: list[str] = []
        self.tool_parse_errors = 0
        self.turn_log: list[dict] = []  # per turn: engine_s, proxy_s (wall) / proxy_cpu_s outside the engine, token counts
        self.created = time.time()

    def _set_status(self, status: str) -> None:
        if _STATUS_RANK[status] > _STATUS_RANK[self.status]:
            self.status = status

    def _extends(self, messages: list, tools_key: str | None) -> bool:
        """Is ``messages`` the history this sequence saw, plus new messages?

        Every assistant message the session produced matches by role and tool-call ids only (clients
        re-serialize them); client messages match as raw dicts, or equal once normalized.
        Per turn only the boundary is checked, O(1) in the history: the count, the tools, the first
        message, the reply produced last (its tool-call ids are unique) and the message before it. A
        rewrite that drops, inserts or condenses messages shifts that boundary and is caught; an
        in-place edit of an older message that keeps the count is caught only with
        ``full_history_check`` (every message, every turn: O(history))."""
        n = len(self.history)
        if not self.seq or tools_key != self.tools_key or len(messages) < n:
            return False
        check = range(n) if self.proxy.full_history_check else sorted({0, max(n - 2, 0), n - 1})
        for i in check:
            kind, want = self.history[i]
            got = messages[i]
            if kind == "client":
                if got != want and (not isinstance(got, dict) or message_key(got, i) != message_key(want, i)):
                    return False
            elif not self._is_produced(got, want):
                return False
        return True

    @staticmethod
    def _is_produced(got: Any, call_ids: tuple) -> bool:
        """Does the client's message stand for an assistant reply with these tool-call ids?"""
        return (isinstance(got, dict) and got.get("role") == "assistant"
                and tuple(c.get("id") if isinstance(c, dict) else None for c in got.get("tool_calls") or ()) == call_ids)

    def complete(self, body: dict) -> dict:
        with self.lock:
            return self._complete(body)

    def _complete(self, body: dict) -> dict:
        t0, c0 = time.perf_counter(), time.thread_time()
        proxy, tpl = self.proxy, self.proxy.template
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ProxyError(400, "'messages' must be a non-empty list")
        tools = body.get("tools") or None
        if tools is not None and not isinstance(tools, list):
            raise ProxyError(400, "'tools' must be a list")
        tools_key = json.dumps(tools, sort_keys=True) if tools else None
        sp = proxy.request_sampling(body)

        # 1. the observation tokens: new messages only (or a full render for a new sequence)
        cont = self._extends(messages, tools_key)
        seen = len(self.history) if cont else 0
        new = [normalize_message(m, i) for i, m in enumerate(messages[seen:], start=seen)]
        if cont:
            obs = tpl.encode(self.owed + tpl.continuation(self.system, new, tools, tools_key))
        else:
            obs = tpl.encode(tpl.render(new, tools, True))
        # the prompt is the session's own list, extended in place (no O(history) copy), rolled back on failure
        prompt = self.seq if cont else []
        mark = len(prompt)
        prompt.extend(obs)

        # 2. the context budget
        budget = proxy.context_budget
        left = budget - len(prompt)
        if left <= 0:
            del prompt[mark:]
            self._set_status("truncated_context")
            self.errors.append(f"turn {self.turns + 1}: prompt of {mark + len(obs)} tokens over the budget {budget}")
            raise ProxyError(400, f"context_length_exceeded: prompt is {mark + len(obs)} tokens, the context budget (proxy.context_budget) is "
                                  f"{budget}: episode {self.episode_id} marked truncated_context",
                             "invalid_request_error", "context_length_exceeded")
        clipped = sp.max_tokens > left
        run_sp = dataclasses.replace(sp, max_tokens=min(sp.max_tokens, left))

        # 3. the engine
        t1, c1 = time.perf_counter(), time.thread_time()
        try:
            res = proxy.engine.generate(prompt, run_sp)
        except Exception as e:
            del prompt[mark:]
            self._set_status("infra_error")
            self.errors.append(f"turn {self.turns + 1}: {type(e).__name__}: {e}")
            if isinstance(e, EngineTimeout):
                raise ProxyError(504, f"engine timeout: {e}", "engine_timeout", "engine_timeout") from None
            raise ProxyError(503, f"engine error: {e}", "engine_error", "engine_error") from None
        engine_s, engine_cpu = time.perf_counter() - t1, time.thread_time() - c1

        # 4. commit: segments, sequence, history
        if not cont:
            if self.seq:
                self.breaks.append(self.n_tokens)
            self.seq, self.history, self.final = prompt, [], []
            self.system = new[0] if new[0]["role"] == "system" else None
            self.tools, self.tools_key = tools, tools_key
        self.segments.append(Segment("observation", obs))
        self.segments.append(Segment("action", list(res.token_ids), list(res.logprobs), list(res.versions)))
        self.n_tokens += len(obs) + len(res.token_ids)
        self.seq.extend(res.token_ids)
        self.owed = tpl.owed_turn_end(res.token_ids)
        if res.finish_reason == "length" and clipped:
            self._set_status("truncated_context")

        # 5. the reply: text (cut at the stop string), tool calls in native mode
        reply_ids = res.token_ids[:-1] if res.token_ids and res.token_ids[-1] in tpl.eos_ids else res.token_ids
        text = tpl.decode(reply_ids)
        if res.stop_str is not None and (hit := find_stop(text, sp.stop)) is not None:
            text = text[:hit[0]]
        content, calls = text, None
        if tools:
            content, calls = parse_tool_calls(text)
            if calls is None and "<tool_call>" in text:
                self.tool_parse_errors += 1
        message = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        if cont:  # the previous reply as the client resent it: what a full re-render would use
            self.final[seen - 1] = normalize_message(messages[seen - 1], seen - 1)
        self.history.extend(("client", m) for m in messages[seen:])
        self.final.extend(new)
        self.history.append(("produced", tuple(c["id"] for c in calls or ())))
        self.final.append(message)

        self.turns += 1
        cid = f"chatcmpl-{uuid.uuid4().hex}"
        self.completion_ids.append(cid)
        self.sampling.append(run_sp.to_dict() | {"max_tokens": sp.max_tokens})
        self.turn_log.append({"prompt_tokens": mark + len(obs), "observation_tokens": len(obs),
                              "completion_tokens": len(res.token_ids), "engine_s": engine_s,
                              "proxy_s": time.perf_counter() - t0 - engine_s,
                              "proxy_cpu_s": time.thread_time() - c0 - engine_cpu, "new_sequence": not cont})
        n_prompt = mark + len(obs)
        return {
            "id": cid, "object": "chat.completion", "created": int(time.time()), "model": proxy.model_name,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": "tool_calls" if calls else res.finish_reason}],
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": len(res.token_ids),
                      "total_tokens": n_prompt + len(res.token_ids)},
        }

    def trajectory(self) -> Trajectory:
        """The episode so far as a trace (reward None: grading happens elsewhere), with a drift report."""
        with self.lock:
            tpl = self.proxy.template
            meta: dict[str, Any] = {
                "episode_id": self.episode_id, "model": self.proxy.model_name,
                "tokenizer": self.proxy.tokenizer_path, "engine": self.proxy.engine.kind,
                "sampling": self.sampling[0] if self.sampling else None,
                "completion_ids": list(self.completion_ids), "errors": list(self.errors),
                "tool_parse_errors": self.tool_parse_errors, "context_budget": self.proxy.context_budget,
            }
            if any(s != self.sampling[0] for s in self.sampling):
                meta["sampling_per_turn"] = list(self.sampling)
            if self.final:
                meta["drift"] = drift_report(tpl, self.seq + tpl.encode(self.owed), self.final, self.tools)
            log = self.turn_log
            timings = {"engine_s": sum(t["engine_s"] for t in log), "proxy_s": sum(t["proxy_s"] for t in log),
                       "wall_s": time.time() - self.created}
            return Trajectory(task_id=self.task_id, segments=list(self.segments), status=self.status, reward=None,
                              turns=self.turns, timings=timings, metadata=meta, breaks=list(self.breaks)).validate()


# --- the server -------------------------------------------------------------------------------
class ProxyServer:
    """The proxy for one engine: sessions by episode id, a FastAPI app, an optional trace store."""

    def __init__(self, engine, tokenizer, cfg, store=None, model_name: str | None = None,
                 full_history_check: bool | None = None):
        self.engine, self.cfg, self.store = engine, cfg, store
        # see Session._extends; default: proxy.full_history_check
        self.full_history_check = cfg.proxy.full_history_check if full_history_check is None else full_history_check
        self.template = ChatTemplate(tokenizer)
        self.tokenizer_path = str(getattr(tokenizer, "name_or_path", "") or "")
        self.model_name = model_name or cfg.model.path
        self.context_budget = cfg.proxy.context_budget
        self.sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._server = None
        self._thread: threading.Thread | None = None
        self.base_url: str | None = None
        self.app = self._build_app()

    # sessions
    def session(self, episode_id: str, task_id: str | None = None) -> Session:
        with self._lock:
            s = self.sessions.get(episode_id)
            if s is None:
                s = self.sessions[episode_id] = Session(self, episode_id, task_id)
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

    def request_sampling(self, body: dict) -> SamplingParams:
        """The request's sampling parameters, ``cfg.sampling`` for those it leaves out."""
        if body.get("stream"):
            raise ProxyError(400, "stream=true is not supported by this proxy")
        if body.get("n", 1) not in (1, None):
            raise ProxyError(400, "only n=1 is supported")
        stop = body.get("stop")
        if isinstance(stop, str):
            stop = (stop,)
        elif stop is None:
            stop = ()
        elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
            stop = tuple(s for s in stop if s)
        else:
            raise ProxyError(400, "'stop' must be a string or a list of strings")
        top_k = body.get("top_k")
        try:
            return sampling_from_config(
                self.cfg, temperature=body.get("temperature"), top_p=body.get("top_p"),
                top_k=0 if top_k == -1 else top_k,
                max_tokens=body.get("max_completion_tokens") or body.get("max_tokens"),
                stop=stop, seed=body.get("seed"))
        except (ValueError, TypeError) as e:
            raise ProxyError(400, f"bad sampling parameter: {e}") from None

    # HTTP
    def _build_app(self):
        app = FastAPI(title="sao-harness proxy", docs_url=None, redoc_url=None)

        def error(e: ProxyError) -> JSONResponse:
            return JSONResponse(e.body(), status_code=e.status)

        @app.post("/v1/chat/completions")
        async def chat_completions(request: Request):
            try:
                try:
                    body = json.loads(await request.body())
                except (json.JSONDecodeError, UnicodeDecodeError) as e:
                    raise ProxyError(400, f"request body is not valid JSON: {e}") from None
                if not isinstance(body, dict):
                    raise ProxyError(400, "request body must be a JSON object")
                session = self.session(request.headers.get(HEADER_EPISODE) or DEFAULT_EPISODE,
                                       request.headers.get(HEADER_TASK))
                return JSONResponse(await run_in_threadpool(session.complete, body))
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

        return app

    def start(self, host: str | None = None, port: int = 0, timeout: float = 30.0) -> str:
        """Serve in a background thread on ``host`` (loopback; default ``cfg.proxy.host``) and ``port``
        (0 = a free one); return the OpenAI base URL ``http://host:port/v1``."""
        import uvicorn

        host = host or self.cfg.proxy.host
        check_loopback(host)
        # uvicorn binds the socket itself: a socket handed in with ``sockets=`` costs ~40 ms per keep-alive request
        self._server = uvicorn.Server(uvicorn.Config(self.app, host=host, port=port, log_level="warning",
                                                     access_log=False, lifespan="off"))
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
