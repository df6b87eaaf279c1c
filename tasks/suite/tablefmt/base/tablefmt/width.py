"""How wide a string is on a terminal.

Tables are padded by *display* width, not by ``len()``: East Asian wide
characters take two columns, combining marks and zero-width characters take
none, and ANSI colour sequences take no space at all.
"""

from __future__ import annotations

import re
import unicodedata

# SGR ("Select Graphic Rendition") sequences: colours, bold, underline...
_ANSI_RE = re.compile(r"\x1b\[[0-9]*m")

_ZERO_WIDTH = {"\u200b", "\u200c", "\u200d", "\u2060", "\ufeff"}

ALIGNMENTS = ("left", "right", "center")


def strip_ansi(text: str) -> str:
    """``text`` without its ANSI colour sequences."""
    return _ANSI_RE.sub("", text)


def char_width(ch: str) -> int:
    """Columns taken by one character: 0, 1 or 2."""
    if ch in _ZERO_WIDTH or unicodedata.combining(ch):
        return 0
    if unicodedata.east_asian_width(ch) in ("W", "F"):
        return 2
    return 1


def display_width(text: str) -> int:
    """Columns taken by ``text`` on a terminal (single line)."""
    return sum(char_width(ch) for ch in strip_ansi(text))


def pad(text: str, width: int, align: str = "left") -> str:
    """Pad ``text`` with spaces to ``width`` columns.

    Text that is already as wide or wider is returned unchanged.
    """
    if align not in ALIGNMENTS:
        raise ValueError(f"unknown alignment {align!r}")
    fill = width - display_width(text)
    if fill <= 0:
        return text
    if align == "right":
        return " " * fill + text
    if align == "center":
        left = fill // 2
        return " " * left + text + " " * (fill - left)
    return text + " " * fill


def truncate(text: str, width: int, placeholder: str = "\u2026") -> str:
    """Cut ``text`` to at most ``width`` columns, ending with ``placeholder``."""
    if display_width(text) <= width:
        return text
    room = width - display_width(placeholder)
    out, used = [], 0
    for ch in strip_ansi(text):
        w = char_width(ch)
        if used + w > room:
            break
        out.append(ch)
        used += w
    return "".join(out) + placeholder
