"""Drift check: the proxy's token sequence vs a full re-render of the final message list.

The proxy never re-renders history (architecture decision 3), so its sequence is what the model saw.
A full re-render by the chat template (what a naive harness would train on) can differ: re-dumped
tool arguments, stripped whitespace, dropped reasoning, tokens merged differently across a boundary.
``drift_report`` says where and how much, as a metric (``metadata["drift"]``), never an error.
"""
from __future__ import annotations

from typing import Any


def drift_report(template, proxy_ids: list[int], messages: list[dict], tools: list | None = None,
                 context: int = 8) -> dict[str, Any]:
    """Compare ``proxy_ids`` with ``template.encode(template.render(messages))``.

    ``template`` is a ``harness.proxy.ChatTemplate``. Returns ``equal``, ``first_diff`` (first differing
    position or None), token counts, the differing window between the common prefix and the common
    suffix (``proxy_window`` / ``render_window`` tokens) and a decoded snippet of each side around
    ``first_diff``. O(length).
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
