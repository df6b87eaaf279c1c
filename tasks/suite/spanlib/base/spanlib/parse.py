"""Reading and writing intervals in mathematical notation: ``[1, 5)``, ``(0, 2.5]``."""

from __future__ import annotations

import re

from .interval import Interval

_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_INTERVAL_RE = re.compile(
    rf"^\s*(?P<left>[\[(])\s*(?P<lo>{_NUMBER})\s*[,;]\s*(?P<hi>{_NUMBER})\s*(?P<right>[\])])\s*$"
)


def _number(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        return float(text)


def parse_interval(text: str) -> Interval:
    """``"[1, 5)"`` -> ``Interval(1, 5)``; brackets say which bounds are closed.

    Integers stay integers; anything with a point or an exponent is a float.
    """
    match = _INTERVAL_RE.match(text)
    if not match:
        raise ValueError(f"not an interval: {text!r}")
    return Interval(
        _number(match.group("lo")),
        _number(match.group("hi")),
        lo_closed=match.group("left") == "[",
        hi_closed=match.group("right") == "]",
    )


def format_interval(interval: Interval) -> str:
    """The inverse of :func:`parse_interval` for numeric intervals."""
    return str(interval)
