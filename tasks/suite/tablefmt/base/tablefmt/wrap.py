"""Wrapping cell text to a maximum column width."""

from __future__ import annotations


def _hard_break(word: str, width: int) -> list[str]:
    """Split a word that cannot fit on one line into ``width``-sized pieces."""
    return [word[i : i + width] for i in range(0, len(word), width)]


def wrap_text(text: str, width: int) -> list[str]:
    """Greedy word wrap of one paragraph to lines of at most ``width`` columns.

    Runs of whitespace between words collapse to a single space; words longer
    than ``width`` are broken across lines.
    """
    if width < 1:
        raise ValueError("width must be at least 1")
    lines: list[str] = []
    current = ""
    for word in text.split():
        pieces = _hard_break(word, width) if len(word) > width else [word]
        for piece in pieces:
            if not current:
                current = piece
            elif len(current) + 1 + len(piece) <= width:
                current = f"{current} {piece}"
            else:
                lines.append(current)
                current = piece
    if current or not lines:
        lines.append(current)
    return lines


def wrap_cell(text: str, width: int | None) -> list[str]:
    """The lines of a cell: explicit newlines kept, each line wrapped to ``width``."""
    lines = text.split("\n")
    if width is None:
        return lines
    out: list[str] = []
    for line in lines:
        out.extend(wrap_text(line, width))
    return out
