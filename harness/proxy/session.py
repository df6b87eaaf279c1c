"""One episode's session: the token bookkeeping of the proxy.

The token invariant. An episode's trace is a list of segments, alternately observation tokens
``obs_i`` (rendered by the proxy) and action tokens ``act_i`` (sampled by the engine). Within a
sequence (the turns since the last break), the engine's prompt at turn t is exactly the trace's tokens
of that sequence so far plus the new observation:

    prompt_t = obs_1 + act_1 + ... + obs_{t-1} + act_{t-1} + obs_t        (``Session.seq`` + ``obs_t``)

so every sampled token's logprob is conditioned on exactly the trace tokens before it. ``act_i`` are the
engine's ids, never decoded and re-encoded; ``obs_t`` is what the template puts after ``act_{t-1}``: the
end-of-turn text it still owes, the new messages (tool results, user nudges) and the generation prompt,
rendered anchored on the end of that turn (``ChatTemplate.after_reply``). When the client's
messages do not extend what the sequence saw (``Session._extends``), a new sequence starts whose
``obs_1`` is a full render of the messages, and ``Trajectory.breaks`` records the trace offset where it
starts. A turn that fails (budget, engine) leaves the trace and the sequence as they were.

Routed experts (an engine with ``returns_routes``: an MoE policy). A token's route is the one of the turn
that first fed it to the model: each turn asks for the routes of the positions no earlier turn routed
(``routes_from``), the earlier ones stay. That is the computation the later tokens were sampled on when
the engine reuses its KV cache for the prefix (vLLM's prefix caching), and with no weight update between
turns a re-prefill routes the prefix the same way. One row per trace token (``Trajectory.routed_experts``);
the last token (never fed back) and, after a break, the old sequence's last token get -1. A turn
answered without routes drops them for the whole episode (``metadata.routes``), never half a trace.
"""
from __future__ import annotations

import dataclasses
import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np

from sao_harness.harness.engines import EngineTimeout, GenerateResult, SamplingParams, sampling_from_config
from sao_harness.harness.engines.protocol import find_stop
from sao_harness.harness.engines.routes import NO_ROUTE, ROUTE_DTYPE, check_routes
from sao_harness.harness.proxy.messages import ProxyError, is_produced, message_key, normalize_message
from sao_harness.harness.proxy.parsers import REASONING_PARSERS, TOOL_PARSERS, no_tool_parser
from sao_harness.harness.proxy.template import ChatTemplate, drift_report
from sao_harness.harness.trace import Segment, Status, Trajectory

_STATUS_RANK = {Status.OK: 0, Status.TRUNCATED_CONTEXT: 1, Status.INFRA_ERROR: 2}


def request_sampling(cfg, body: dict) -> SamplingParams:
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
            cfg, temperature=body.get("temperature"), top_p=body.get("top_p"),
            top_k=0 if top_k == -1 else top_k,
            max_tokens=body.get("max_completion_tokens") or body.get("max_tokens"),
            stop=stop, seed=body.get("seed"))
    except (ValueError, TypeError) as e:
        raise ProxyError(400, f"bad sampling parameter: {e}") from None


@dataclasses.dataclass(frozen=True)
class SessionSetup:
    """What every session of one proxy shares: the engine, the template and parsers, the limits."""

    engine: Any  # harness.engines.Engine
    template: ChatTemplate
    tool_parser: Any  # harness.proxy.parsers: messages text -> (content, tool calls)
    reasoning_parser: Any  # or None
    model_name: str
    tokenizer_path: str
    context_budget: int
    context_budget_source: str
    full_history_check: bool  # see Session._extends
    sampling: Callable[[dict], SamplingParams]  # request body -> its sampling parameters (request_sampling)


class Session:
    """One episode's token sequence and trace. ``complete`` is one turn; calls are serialized."""

    def __init__(self, setup: SessionSetup, episode_id: str, task_id: str | None):
        self.setup, self.episode_id, self.task_id = setup, episode_id, task_id or episode_id
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
        self.owed = ""  # end-of-turn text the last reply still owes (for the drift report)
        self.last_reply: list[int] = []  # the last reply's final token (the stop it sampled, if any)
        self.last_calls: list[tuple[str, str]] = []  # the last reply's tool calls (id, name)
        self.status = Status.OK
        self.breaks: list[int] = []
        self.turns = 0
        self.completion_ids: list[str] = []
        self.sampling: list[dict] = []
        self.errors: list[str] = []
        self.tool_parse_errors = 0
        # per turn: engine_s, proxy_s (wall) / proxy_cpu_s outside the engine, token counts
        self.turn_log: list[dict] = []
        self.created = time.time()
        # routed experts (module doc): parts in trace order covering tokens [0, n_routed); None: not recorded
        self.routes: list | None = [] if getattr(setup.engine, "returns_routes", False) else None
        self.routes_note = "recorded" if self.routes is not None else "the engine returns none"
        self.n_routed = 0

    def _set_status(self, status: Status) -> None:
        if _STATUS_RANK[status] > _STATUS_RANK[self.status]:
            self.status = status

    def complete(self, body: dict) -> dict:
        """One turn: a chat-completions request body -> the chat-completion response."""
        with self.lock:
            return self._complete(body)

    def _complete(self, body: dict) -> dict:
        t0, c0 = time.perf_counter(), time.thread_time()
        messages, tools, tools_key = _request_messages(body)
        sp = self.setup.sampling(body)
        cont = self._extends(messages, tools_key)
        seen = len(self.history) if cont else 0
        new = [normalize_message(m, i) for i, m in enumerate(messages[seen:], start=seen)]
        obs = self._observation(new, tools, tools_key, cont)
        prompt = self.seq if cont else []  # the session's own list, extended in place (no O(history) copy)
        mark = len(prompt)  # ... and rolled back to ``mark`` on failure
        seq_start = self.n_tokens - mark  # the trace index of the prompt's first token
        prompt.extend(obs)
        run_sp, clipped = self._budget(prompt, mark, sp)
        if self.routes is not None:
            run_sp = dataclasses.replace(run_sp, routes_from=max(0, self.n_routed - seq_start))
        res, engine_s, engine_cpu = self._generate(prompt, mark, run_sp)
        self._record_routes(res, len(prompt), seq_start, run_sp.routes_from)
        self._record_tokens(prompt, obs, res, clipped, cont, new, tools, tools_key)
        message = self._reply(res, sp, tools)
        self._record_messages(messages, seen, new, message, cont)
        self.turns += 1
        self.sampling.append(run_sp.to_dict() | {"max_tokens": sp.max_tokens})
        self.turn_log.append({"prompt_tokens": mark + len(obs), "observation_tokens": len(obs),
                              "completion_tokens": len(res.token_ids), "engine_s": engine_s,
                              "proxy_s": time.perf_counter() - t0 - engine_s,
                              "proxy_cpu_s": time.thread_time() - c0 - engine_cpu, "new_sequence": not cont})
        return self._response(message, res, n_prompt=mark + len(obs))

    # --- the steps of a turn ------------------------------------------------------------------
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
        check = range(n) if self.setup.full_history_check else sorted({0, max(n - 2, 0), n - 1})
        for i in check:
            kind, want = self.history[i]
            got = messages[i]
            if kind == "client":
                if got != want and (not isinstance(got, dict) or message_key(got, i) != message_key(want, i)):
                    return False
            elif not is_produced(got, want):
                return False
        return True

    def _observation(self, new: list[dict], tools: list | None, tools_key: str | None, cont: bool) -> list[int]:
        """The observation ids: what the template puts after the last reply (the turn end it owes, ``new``,
        the generation prompt), or for a new sequence a full render of ``new``."""
        tpl = self.setup.template
        if tools and self.setup.tool_parser is None:
            raise no_tool_parser()
        if cont:
            return tpl.encode(tpl.after_reply(self.system, new, tools, self.last_reply, self.last_calls))
        return tpl.encode(tpl.render_checked(new, tools, True))

    def _budget(self, prompt: list[int], mark: int, sp: SamplingParams) -> tuple[SamplingParams, bool]:
        """Clip ``max_tokens`` to the context budget left: ``(sampling to run, clipped?)``. A prompt
        already over the budget marks the episode ``truncated_context``: 400 ``context_length_exceeded``."""
        budget = self.setup.context_budget
        left = budget - len(prompt)
        if left <= 0:
            n_prompt = len(prompt)
            del prompt[mark:]
            self._set_status(Status.TRUNCATED_CONTEXT)
            self.errors.append(f"turn {self.turns + 1}: prompt of {n_prompt} tokens over the budget {budget}")
            raise ProxyError(400, f"context_length_exceeded: prompt is {n_prompt} tokens, "
                                  f"the context budget ({self.setup.context_budget_source}) is "
                                  f"{budget}: episode {self.episode_id} marked truncated_context",
                             "invalid_request_error", "context_length_exceeded")
        return dataclasses.replace(sp, max_tokens=min(sp.max_tokens, left)), sp.max_tokens > left

    def _generate(self, prompt: list[int], mark: int, sp: SamplingParams) -> tuple[GenerateResult, float, float]:
        """The engine's reply to ``prompt``, and its wall / CPU seconds. An engine failure marks the
        episode ``infra_error``: 504 on a timeout, else 503."""
        t1, c1 = time.perf_counter(), time.thread_time()
        try:
            res = self.setup.engine.generate(prompt, sp)
        except Exception as e:
            del prompt[mark:]
            self._set_status(Status.INFRA_ERROR)
            self.errors.append(f"turn {self.turns + 1}: {type(e).__name__}: {e}")
            if isinstance(e, EngineTimeout):
                raise ProxyError(504, f"engine timeout: {e}", "engine_timeout", "engine_timeout") from None
            raise ProxyError(503, f"engine error: {e}", "engine_error", "engine_error") from None
        return res, time.perf_counter() - t1, time.thread_time() - c1

    def _record_routes(self, res: GenerateResult, n_prompt: int, seq_start: int, routes_from: int | None) -> None:
        """Keep the turn's routes of the positions no earlier turn routed (module doc): -1 rows over a gap
        (a break), then the engine's ``n_prompt - routes_from + len(tokens) - 1`` rows."""
        if self.routes is None:
            return
        if res.routes is None:
            self.routes, self.routes_note = None, f"dropped: turn {self.turns + 1} came back without routes"
            return
        rows = n_prompt - routes_from + len(res.token_ids) - 1
        shape = self.routes[0].shape[1:] if self.routes else tuple(res.routes.shape[1:])
        routes = check_routes(res.routes, rows, shape, f"episode {self.episode_id} turn {self.turns + 1}")
        start = seq_start + routes_from
        if start > self.n_routed:
            self.routes.append(np.full((start - self.n_routed, *shape), NO_ROUTE, dtype=ROUTE_DTYPE))
        self.routes.append(routes)
        self.n_routed = start + rows

    def _record_tokens(self, prompt: list[int], obs: list[int], res: GenerateResult, clipped: bool, cont: bool,
                       new: list[dict], tools: list | None, tools_key: str | None) -> None:
        """Commit the turn's tokens: a break for a new sequence, the observation and action segments."""
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
        self.owed = self.setup.template.owed_turn_end(res.token_ids)
        self.last_reply = list(res.token_ids[-1:])
        if res.finish_reason == "length" and clipped:
            self._set_status(Status.TRUNCATED_CONTEXT)

    def _reply(self, res: GenerateResult, sp: SamplingParams, tools: list | None) -> dict:
        """The assistant message: the text (cut at the stop string), its reasoning split out by
        ``proxy.reasoning_parser``; with ``tools``, the calls ``proxy.tool_parser`` reads (harness.proxy.parsers)."""
        tpl = self.setup.template
        reply_ids = res.token_ids[:-1] if res.token_ids and res.token_ids[-1] in tpl.eos_ids else res.token_ids
        text = tpl.decode(reply_ids)
        if res.stop_str is not None and (hit := find_stop(text, sp.stop)) is not None:
            text = text[:hit[0]]
        reasoning = None
        if self.setup.reasoning_parser:
            reasoning, text = REASONING_PARSERS[self.setup.reasoning_parser](text)
        content, calls = text, None
        if tools:
            content, calls, attempted = TOOL_PARSERS[self.setup.tool_parser](text, tools)
            if calls is None and attempted:
                self.tool_parse_errors += 1
        message = {"role": "assistant", "content": content}
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        if calls:
            message["tool_calls"] = calls
        return message

    def _record_messages(self, messages: list, seen: int, new: list[dict], message: dict, cont: bool) -> None:
        """Commit the turn's messages: the client's new ones and the reply produced."""
        if cont:  # the previous reply as the client resent it: what a full re-render would use
            self.final[seen - 1] = normalize_message(messages[seen - 1], seen - 1)
        self.history.extend(("client", m) for m in messages[seen:])
        self.final.extend(new)
        self.history.append(("produced", tuple(c["id"] for c in message.get("tool_calls") or ())))
        self.last_calls = [(c["id"], c["function"]["name"]) for c in message.get("tool_calls") or ()]
        self.final.append(normalize_message(message, len(self.final)))  # as a client resends it: text, no reasoning

    def _response(self, message: dict, res: GenerateResult, n_prompt: int) -> dict:
        """The OpenAI chat-completion object; its id is recorded in the trace's ``completion_ids``."""
        cid = f"chatcmpl-{uuid.uuid4().hex}"
        self.completion_ids.append(cid)
        return {
            "id": cid, "object": "chat.completion", "created": int(time.time()), "model": self.setup.model_name,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": "tool_calls" if "tool_calls" in message else res.finish_reason}],
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": len(res.token_ids),
                      "total_tokens": n_prompt + len(res.token_ids)},
        }

    # --- the trace ----------------------------------------------------------------------------
    def trajectory(self) -> Trajectory:
        """The episode so far as a trace (reward None: grading happens elsewhere), with a drift report."""
        with self.lock:
            tpl = self.setup.template
            meta: dict[str, Any] = {
                "episode_id": self.episode_id, "model": self.setup.model_name,
                "tokenizer": self.setup.tokenizer_path, "engine": self.setup.engine.kind,
                "sampling": self.sampling[0] if self.sampling else None,
                "completion_ids": list(self.completion_ids), "errors": list(self.errors),
                "tool_parse_errors": self.tool_parse_errors, "context_budget": self.setup.context_budget,
            }
            if any(s != self.sampling[0] for s in self.sampling):
                meta["sampling_per_turn"] = list(self.sampling)
            if self.final:
                meta["drift"] = drift_report(tpl, self.seq + tpl.encode(self.owed), self.final, self.tools)
            log = self.turn_log
            timings = {"engine_s": sum(t["engine_s"] for t in log), "proxy_s": sum(t["proxy_s"] for t in log),
                       "wall_s": time.time() - self.created}
            meta["routes"] = self.routes_note
            return Trajectory(task_id=self.task_id, segments=list(self.segments), status=self.status, reward=None,
                              turns=self.turns, timings=timings, metadata=meta, breaks=list(self.breaks),
                              routed_experts=self._routed_experts()).validate()

    def _routed_experts(self) -> np.ndarray | None:
        """One route row per trace token, -1 past the last routed one; None when not recorded (or no turn)."""
        if not self.routes:
            return None
        shape = self.routes[0].shape[1:]
        tail = np.full((self.n_tokens - self.n_routed, *shape), NO_ROUTE, dtype=ROUTE_DTYPE)
        return np.concatenate([*self.routes, tail])


def _request_messages(body: dict) -> tuple[list, list | None, str | None]:
    """The request's ``messages`` and ``tools``, and a key that says whether the tools changed."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ProxyError(400, "'messages' must be a non-empty list")
    tools = body.get("tools") or None
    if tools is not None and not isinstance(tools, list):
        raise ProxyError(400, "'tools' must be a list")
    return messages, tools, json.dumps(tools, sort_keys=True) if tools else None
