"""The tokenizer's chat template as the proxy uses it, and the drift check.

``ChatTemplate`` renders full prompts, the continuation after an assistant turn and the end-of-turn text
a reply owes. ``drift_report`` compares the session's token sequence with a full re-render of the final
message list (what a naive harness would train on). They can differ: re-dumped tool arguments, stripped
whitespace, dropped reasoning, tokens merged differently across a boundary. The report says where and
how much, as a metric (``metadata["drift"]``), never an error.
"""
from __future__ import annotations

import threading
from typing import Any

from harness.proxy.messages import ProxyError


class ChatTemplate:
    """The tokenizer's chat template, and the two pieces the proxy derives from it."""

    PROBE = "\u2063sao-probe\u2063"

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self._lock = threading.Lock()  # sessions run in several threads; a fast tokenizer may not be re-entrant
        probe = self.render([{"role": "user", "content": "u"}, {"role": "assistant", "content": self.PROBE}],
                            None, False)
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
        """The end-of-turn text the template puts after a reply that was sampled as ``reply_ids``:
        all of ``turn_end`` (e.g. ``<|im_end|>\\n`` after a stop string), or only what follows a sampled EOS."""
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
