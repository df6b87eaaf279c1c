"""Table styles: which lines to draw and with what characters."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    """A horizontal line: ``begin`` + fill per column, joined by ``sep``, + ``end``."""

    begin: str
    fill: str
    sep: str
    end: str


@dataclass(frozen=True)
class RowFormat:
    """How the cells of one text line are joined."""

    begin: str
    sep: str
    end: str


@dataclass(frozen=True)
class Style:
    name: str
    top: Rule | None
    below_header: Rule | None
    between_rows: Rule | None
    bottom: Rule | None
    header: RowFormat
    row: RowFormat
    #: spaces added on each side of every cell
    padding: int = 0
    #: the rule below the header marks alignment with colons (Markdown)
    alignment_markers: bool = False


_PLAIN_ROW = RowFormat("", "  ", "")
_PIPE_ROW = RowFormat("|", "|", "|")
_GRID_ROW = RowFormat("|", "|", "|")

STYLES: dict[str, Style] = {
    "plain": Style("plain", None, None, None, None, _PLAIN_ROW, _PLAIN_ROW),
    "simple": Style(
        "simple", None, Rule("", "-", "  ", ""), None, None, _PLAIN_ROW, _PLAIN_ROW
    ),
    "grid": Style(
        "grid",
        Rule("+", "-", "+", "+"),
        Rule("+", "=", "+", "+"),
        Rule("+", "-", "+", "+"),
        Rule("+", "-", "+", "+"),
        _GRID_ROW,
        _GRID_ROW,
        padding=1,
    ),
    "pipe": Style(
        "pipe",
        None,
        Rule("|", "-", "|", "|"),
        None,
        None,
        _PIPE_ROW,
        _PIPE_ROW,
        padding=1,
        alignment_markers=True,
    ),
    "rst": Style(
        "rst",
        Rule("", "=", "  ", ""),
        Rule("", "=", "  ", ""),
        None,
        Rule("", "=", "  ", ""),
        _PLAIN_ROW,
        _PLAIN_ROW,
    ),
}

#: the name Markdown users look for
STYLES["markdown"] = STYLES["pipe"]


def get_style(style: str | Style) -> Style:
    """A style by name (or a :class:`Style` passed through)."""
    if isinstance(style, Style):
        return style
    try:
        return STYLES[style]
    except KeyError:
        known = ", ".join(sorted(STYLES))
        raise ValueError(f"unknown table style {style!r} (known: {known})") from None


def rule_cells(rule: Rule, widths: list[int], aligns: list[str], markers: bool) -> list[str]:
    """The fill of each column for a horizontal rule.

    With ``markers``, a colon at either end says how the column is aligned,
    as Markdown tables expect: ``:---`` left, ``---:`` right, ``:---:`` centre.
    """
    cells = []
    for width, align in zip(widths, aligns):
        fill = rule.fill * width
        if markers:
            if align in ("left", "center"):
                fill = ":" + fill[1:]
            if align == "right":
                fill = fill[:-1] + ":"
        cells.append(fill)
    return cells
