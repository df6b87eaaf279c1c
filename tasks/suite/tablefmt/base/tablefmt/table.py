"""The :class:`Table` object and :func:`tabulate`."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from . import cells as cellmod
from .styles import Style, get_style, rule_cells
from .width import display_width, pad
from .wrap import wrap_cell

AUTO = None
#: accepted values for ``align``; "decimal" lines numbers up on their point
COLUMN_ALIGNMENTS = ("left", "right", "center", "decimal")


class Table:
    """Rows of values with optional headers, rendered in one of several styles.

    >>> t = Table([["apple", 3], ["kiwi", 12]], headers=["fruit", "qty"])
    >>> print(t.render("simple"))
    fruit  qty
    -----  ---
    apple    3
    kiwi    12
    """

    def __init__(
        self,
        rows: Iterable[Sequence[Any]] = (),
        headers: Sequence[Any] = (),
        *,
        align: str | Sequence[str | None] | None = AUTO,
        floatfmt: str = "g",
        missing: str = "",
        maxcolwidths: int | Sequence[int | None] | None = None,
    ):
        self.headers = [str(h) for h in headers]
        self.rows: list[list[Any]] = []
        self.align = align
        self.floatfmt = floatfmt
        self.missing = missing
        self.maxcolwidths = maxcolwidths
        for row in rows:
            self.add_row(row)

    def add_row(self, row: Sequence[Any]) -> None:
        """Append a row; short rows are completed with missing values."""
        self.rows.append(list(row))

    @property
    def ncols(self) -> int:
        return max([len(self.headers)] + [len(row) for row in self.rows])

    def column(self, index: int) -> list[Any]:
        """The raw values of one column (``None`` where a row is short)."""
        return [row[index] if index < len(row) else None for row in self.rows]

    # -- layout -----------------------------------------------------------

    def _per_column(self, option: Any, name: str) -> list[Any]:
        n = self.ncols
        if option is None or isinstance(option, (str, int)):
            return [option] * n
        values = list(option)
        if len(values) > n:
            raise ValueError(f"{name} has {len(values)} entries for {n} columns")
        return values + [None] * (n - len(values))

    def _alignments(self, types: list[str]) -> list[str]:
        aligns = []
        for kind, wanted in zip(types, self._per_column(self.align, "align")):
            if wanted is None:
                wanted = {cellmod.INT: "right", cellmod.FLOAT: "decimal"}.get(kind, "left")
            if wanted not in COLUMN_ALIGNMENTS:
                raise ValueError(f"unknown alignment {wanted!r}")
            aligns.append(wanted)
        return aligns

    def layout(self) -> tuple[list[list[str]], list[list[list[str]]], list[int], list[str]]:
        """Everything :meth:`render` needs.

        Returns ``(header_lines, row_lines, widths, aligns)``, where a cell is
        a list of text lines, ``widths`` are display widths without padding,
        and ``aligns`` are resolved to left/right/center.
        """
        n = self.ncols
        types = [cellmod.column_type(self.column(i)) for i in range(n)]
        aligns = self._alignments(types)
        maxwidths = self._per_column(self.maxcolwidths, "maxcolwidths")

        columns: list[list[str]] = []
        for i in range(n):
            texts = [
                cellmod.format_cell(v, types[i], self.floatfmt, self.missing)
                for v in self.column(i)
            ]
            if aligns[i] == "decimal":
                texts = cellmod.align_decimal(texts)
            columns.append(texts)

        body = [
            [wrap_cell(columns[i][r], maxwidths[i]) for i in range(n)]
            for r in range(len(self.rows))
        ]
        headers = self.headers + [""] * (n - len(self.headers))
        head = [wrap_cell(h, maxwidths[i]) for i, h in enumerate(headers)] if self.headers else []

        widths = []
        for i in range(n):
            lines = [line for row in body for line in row[i]]
            if head:
                lines += head[i]
            widths.append(max((display_width(line) for line in lines), default=0))
        resolved = ["right" if a == "decimal" else a for a in aligns]
        return head, body, widths, resolved

    # -- rendering --------------------------------------------------------

    def render(self, style: str | Style = "simple") -> str:
        """The table as text, without a trailing newline."""
        st = get_style(style)
        head, body, widths, aligns = self.layout()
        padded = [w + 2 * st.padding for w in widths]
        space = " " * st.padding
        out: list[str] = []

        def rule(r) -> None:
            if r is not None:
                fills = rule_cells(r, padded, aligns, markers=False)
                out.append(r.begin + r.sep.join(fills) + r.end)

        def text_row(cells: list[list[str]], fmt) -> None:
            height = max((len(c) for c in cells), default=1)
            for k in range(height):
                parts = []
                for i, lines in enumerate(cells):
                    text = lines[k] if k < len(lines) else ""
                    parts.append(space + pad(text, widths[i], aligns[i]) + space)
                out.append((fmt.begin + fmt.sep.join(parts) + fmt.end).rstrip())

        rule(st.top)
        if head:
            text_row(head, st.header)
            if st.below_header is not None:
                r = st.below_header
                fills = rule_cells(r, padded, aligns, markers=st.alignment_markers)
                out.append(r.begin + r.sep.join(fills) + r.end)
        for index, row in enumerate(body):
            if index:
                rule(st.between_rows)
            text_row(row, st.row)
        rule(st.bottom)
        return "\n".join(out)

    def __str__(self) -> str:
        return self.render()


def tabulate(
    rows: Iterable[Sequence[Any]],
    headers: Sequence[Any] = (),
    style: str | Style = "simple",
    **options: Any,
) -> str:
    """Render ``rows`` in one call; ``options`` go to :class:`Table`."""
    return Table(rows, headers, **options).render(style)
