"""The tokenizer's chat template as the proxy uses it, and the drift check.

``ChatTemplate`` renders full prompts and the observation that follows an assistant turn. The model
always sees its own sampled tokens: past replies are never re-rendered. After a reply, the new messages
(tool results, user turns) and the generation prompt are rendered *anchored on the end of that reply*,
a probe assistant turn whose content is a per-template random marker P:

    full = render([system?, user ".", assistant P] + new, add_generation_prompt=True)
    after = full[full.index(P) + len(P):]       # the turn end + new messages + generation prompt

``after`` is what the template puts after an assistant's content when ``new`` follows it, whatever the
template does before or inside earlier turns (Qwen3's think blocks in the last turn, reasoning it strips
from old turns, tools in the first user turn): only the end of the previous turn is compared, never a
prefix of a dummy conversation. Consecutive tool messages come out grouped exactly as the template
groups them. Templates that render a tool result only after an assistant turn with tool calls
(gpt-oss, MiniMax: the result's header names the call) get a probe with the reply's calls (their ids
and names, arguments ``{}``): the observation then starts at the last stop token (``<|call|>``,
``<|im_end|>``; or the text that ends a plain turn) of the turn end that the probe rendered alone and
followed by ``new`` share. If the reply ended with a stop token that ``after`` begins with
(``<|im_end|>``, ``<|eot_id|>``, GLM's ``<|observation|>``), that token is already in the sequence and
is not repeated. Tool-call arguments go to the template as objects (as vLLM passes them); a template
that only concatenates strings (DeepSeek-V3.1) gets them as JSON text.

A template that drops or rewrites an assistant turn's content once another message follows cannot be
anchored: ``check_continuable`` says so when the proxy starts (``TemplateError``, naming the feature and
what to do), and a request the template refuses to render is a 400 ``template_error``, never a 500.

``drift_report`` compares the session's token sequence with a full re-render of the final message list
(what a naive harness would train on). They differ for templates that strip history (old reasoning),
re-dumped tool arguments, whitespace, tokens merged across a boundary. The report says where and how
much, as a metric (``metadata["drift"]``), never an error.
"""
from __future__ import annotations

import re
import secrets
import threading
from pathlib import Path
from typing import Any

from sao_harness.core.errors import UserError
from sao_harness.harness.proxy.messages import ProxyError, for_template

_SAFE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # a call's name as the probe may carry it


class TemplateError(UserError):
    """A chat template the proxy cannot continue token-exactly (raised when the proxy starts)."""


def stop_token_ids(tokenizer) -> set[int]:
    """The ids that end a reply: the model directory's ``generation_config.json`` ``eos_token_id``
    (one or a list, as the engines read it) and the tokenizer's EOS."""
    ids = [tokenizer.eos_token_id]
    path = Path(str(getattr(tokenizer, "name_or_path", "") or ""))
    if (path / "generation_config.json").is_file():
        from transformers import GenerationConfig  # lazy: transformers is heavy

        eos = GenerationConfig.from_pretrained(path).eos_token_id
        ids += eos if isinstance(eos, list) else [eos]
    return {int(i) for i in ids if i is not None}


class ChatTemplate:
    """The tokenizer's chat template (or ``chat_template``, a Jinja text) with ``kwargs`` passed to every
    render (e.g. ``enable_thinking``), and what the proxy derives from it."""

    DUMMY_TOOLS = [{"type": "function", "function": {"name": "probe", "description": "",
                                                      "parameters": {"type": "object", "properties": {}}}}]

    def __init__(self, tokenizer, chat_template: str | None = None, kwargs: dict | None = None,
                 eos_ids: set[int] | None = None):
        self.tok = tokenizer
        self.source = chat_template or tokenizer.chat_template or ""
        self.chat_template = chat_template
        self.kwargs = dict(kwargs or {})
        self._lock = threading.Lock()  # sessions run in several threads; a fast tokenizer may not be re-entrant
        # the probe: random per template, so no text a policy writes or a tool prints can be taken for it
        self.probe = f"\u2063{secrets.token_hex(8)}\u2063"
        probe = [{"role": "user", "content": "u"}, {"role": "assistant", "content": self.probe}]
        try:
            try:
                rendered = self.render(probe, None, False)
            except Exception:  # noqa: BLE001  (a template that iterates over `tools` unconditionally: Hermes-3)
                rendered = self.render(probe, self.DUMMY_TOOLS, False)
        except Exception as e:  # noqa: BLE001  (an undefined variable such as bos_token, a raise_exception ...)
            raise TemplateError(f"chat template cannot render a user turn and an assistant turn: "
                                f"{type(e).__name__}: {e}") from None
        if self.probe not in rendered:
            raise TemplateError("chat template does not render an assistant turn's content verbatim: the proxy "
                                "cannot place the model's own tokens in it; use a template that does "
                                "(proxy.chat_template)")
        self.turn_end = rendered[rendered.index(self.probe) + len(self.probe):]  # e.g. "<|im_end|>\n"; GLM: ""
        self.eos_ids = stop_token_ids(tokenizer) if eos_ids is None else set(eos_ids)
        self._stop_text = {i: tokenizer.convert_ids_to_tokens(i) for i in self.eos_ids}

    def render(self, messages: list[dict], tools: list | None, add_generation_prompt: bool) -> str:
        """The template's text of ``messages``; tool-call arguments as objects, or as JSON text for a
        template that only concatenates strings (it raises ``TypeError`` on an object)."""
        with self._lock:
            try:
                return self._apply(for_template(messages), tools, add_generation_prompt)
            except TypeError:
                return self._apply(messages, tools, add_generation_prompt)

    def _apply(self, messages: list[dict], tools: list | None, add_generation_prompt: bool) -> str:
        return self.tok.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                            add_generation_prompt=add_generation_prompt,
                                            chat_template=self.chat_template, **self.kwargs)

    def encode(self, text: str) -> list[int]:
        with self._lock:
            return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        with self._lock:
            return self.tok.decode(ids, skip_special_tokens=False)

    def sampled_stop(self, reply_ids: list[int]) -> str:
        """The text of the stop token that ended ``reply_ids`` ("" if it ended otherwise)."""
        return self._stop_text.get(reply_ids[-1], "") if reply_ids else ""

    def owed_turn_end(self, reply_ids: list[int]) -> str:
        """The end-of-turn text the template puts after a reply that was sampled as ``reply_ids``:
        all of ``turn_end`` (e.g. ``<|im_end|>\\n`` after a stop string), or only what follows a sampled stop."""
        return self.turn_end.removeprefix(self.sampled_stop(reply_ids))

    def after_reply(self, system: dict | None, new: list[dict], tools: list | None, reply_ids: list[int],
                    calls: list[tuple[str, str]] = ()) -> str:
        """The observation text after a reply sampled as ``reply_ids`` with tool ``calls`` (id, name): the
        turn end it still owes, ``new`` as the template renders them after an assistant turn, and the
        generation prompt (see the module)."""
        head = ([system] if system else []) + [{"role": "user", "content": "."}]
        after = self._after_calls(head, new, tools, calls) if calls else None
        if after is None:
            full = self.render_checked(head + [{"role": "assistant", "content": self.probe}] + new, tools, True)
            if full.count(self.probe) != 1:
                raise ProxyError(400, "the chat template drops or rewrites an assistant turn's content when "
                                 f"{new[0]['role']!r} messages follow it, so the model's own tokens cannot be "
                                 "kept; use a template that renders past assistant content verbatim "
                                 "(proxy.chat_template)", "invalid_request_error", "template_error")
            after = full[full.index(self.probe) + len(self.probe):]
        return after.removeprefix(self.sampled_stop(reply_ids))

    def _after_calls(self, head: list[dict], new: list[dict], tools: list | None,
                     calls: list[tuple[str, str]]) -> str | None:
        """``after`` from a probe that carries the reply's calls, cut at the last stop token of the turn end
        shared by the probe alone and the probe followed by ``new``; None where that does not apply."""
        probe = {"role": "assistant", "content": self.probe, "tool_calls": [
            {"id": i, "type": "function", "function": {"name": n if _SAFE_NAME.fullmatch(n) else "tool",
                                                       "arguments": "{}"}} for i, n in calls]}
        try:
            alone, full = self.render(head + [probe], tools, False), self.render(head + [probe] + new, tools, True)
        except Exception:  # noqa: BLE001  (the content-only probe answers, or names the failure)
            return None
        if alone.count(self.probe) != 1 or full.count(self.probe) != 1:
            return None
        alone, full = (t[t.index(self.probe) + len(self.probe):] for t in (alone, full))
        shared = next((i for i, (a, b) in enumerate(zip(alone, full)) if a != b), min(len(alone), len(full)))
        ends = {*self._stop_text.values(), self.turn_end.strip()} - {""}  # the stop tokens; the plain turn's end
        cut = max(full.rfind(end, 0, shared) for end in ends) if ends else -1
        if cut < 0 or any(m["content"] not in full[cut:] for m in new):
            return None
        return full[cut:]

    def render_checked(self, messages: list[dict], tools: list | None, add_generation_prompt: bool) -> str:
        """``render``; a template that refuses the messages (``raise_exception``, a bad role) -> a 400."""
        try:
            return self.render(messages, tools, add_generation_prompt)
        except Exception as e:  # jinja2's TemplateError, or whatever the template's Python raises
            raise ProxyError(400, f"the chat template cannot render these messages: {type(e).__name__}: {e}",
                             "invalid_request_error", "template_error") from None

    def check_continuable(self, tool_results: bool = True, tools: list | None = None) -> None:
        """Raise ``TemplateError`` unless the template can be continued after an assistant turn by a user
        turn and, with ``tool_results`` (native tool calls), by one tool result and two consecutive ones."""
        def result(i: int) -> dict:
            return {"role": "tool", "tool_call_id": f"call{i:05d}", "content": f"result {i}"}

        cases = {"a tool result": [result(1)], "two consecutive tool results": [result(1), result(2)],
                 "a user turn": [{"role": "user", "content": "result 1"}]}
        if not tool_results:
            cases = {"a user turn": cases["a user turn"]}
        tools = tools or (self.DUMMY_TOOLS if tool_results else None)  # native tool calls: tools are declared
        for what, new in cases.items():
            try:
                after = self.after_reply(None, new, tools, [], [(f"call{i:05d}", "probe") for i in (1, 2)][:len(new)]
                                        if new[0]["role"] == "tool" else [])
            except ProxyError as e:
                raise TemplateError(f"chat template cannot be continued after an assistant turn by {what}: "
                                    f"{e.message}") from None
            missing = [m["content"] for m in new if m["content"] not in after]
            if missing:
                raise TemplateError(f"chat template cannot be continued after an assistant turn by {what}: the "
                                    f"message text {missing[0]!r} does not appear after the turn; use a template "
                                    "that renders new messages after the last assistant turn (proxy.chat_template)")


def drift_report(template: ChatTemplate, proxy_ids: list[int], messages: list[dict], tools: list | None = None,
                 context: int = 8) -> dict[str, Any]:
    """Compare ``proxy_ids`` with ``template.encode(template.render(messages))``.

    Returns ``equal``, ``first_diff`` (first differing position or None), token counts, the differing
    window between the common prefix and the common suffix (``proxy_window`` / ``render_window`` tokens)
    and a decoded snippet of each side around ``first_diff``. O(length).
    """
    try:
        ref = template.encode(template.render(messages, tools, False))
    except Exception as e:  # a template that cannot render the final list is itself worth reporting
        return {"equal": False, "error": f"re-render failed: {type(e).__name__}: {e}", "proxy_tokens": len(proxy_ids)}
    a, b = proxy_ids, ref
    n = min(len(a), len(b))
    prefix = next((i for i in range(n) if a[i] != b[i]), n)
    equal = prefix == n and len(a) == len(b)
    suffix = 0
    while suffix < n - prefix and a[len(a) - 1 - suffix] == b[len(b) - 1 - suffix]:
        suffix += 1
    report: dict[str, Any] = {
        "equal": equal, "first_diff": None if equal else prefix,
        "proxy_tokens": len(a), "render_tokens": len(b),
        "proxy_window": len(a) - prefix - suffix, "render_window": len(b) - prefix - suffix,
    }
    if not equal:
        lo = max(0, prefix - context)
        report["proxy_snippet"] = template.decode(a[lo:prefix + context])
        report["render_snippet"] = template.decode(b[lo:prefix + context])
    return report


def template_from_config(tokenizer, proxy_cfg) -> ChatTemplate:
    """The proxy's ``ChatTemplate``: ``proxy.chat_template`` (a file) or the tokenizer's, rendered with
    ``proxy.chat_template_kwargs``, checked to be continuable by what the agent sends (tool results only
    with ``proxy.tool_format: native``): ``TemplateError`` otherwise."""
    text = None
    if proxy_cfg.chat_template is not None:
        path = Path(proxy_cfg.chat_template)
        if not path.is_file():
            raise UserError(f"proxy.chat_template: {path} is not a file")
        text = path.read_text(encoding="utf-8")
    elif not getattr(tokenizer, "chat_template", None):
        raise UserError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template: set "
                        "proxy.chat_template to a Jinja file")
    template = ChatTemplate(tokenizer, text, proxy_cfg.chat_template_kwargs)
    template.check_continuable(tool_results=proxy_cfg.tool_format == "native")
    return template
