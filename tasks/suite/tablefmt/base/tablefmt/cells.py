"""Turning cell values into strings, and deciding how columns align."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction
from typing import Any, Iterable, Sequence

#: column types, from the most to the least specific
INT, FLOAT, TEXT = "int", "float", "text"


def _parse_number(value: str) -> int | float | None:
    text = value.strip().replace("_", "")
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return None
    # "nan" and "inf" are valid floats but nobody means them in a table
    if number != number or number in (float("inf"), float("-inf")):
        return None
    return number


def is_number(value: Any) -> bool:
    """Is ``value`` a number, or a string that reads as one?

    Booleans are not numbers here, whatever Python thinks.
    """
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float, Decimal, Fraction)):
        return True
    if isinstance(value, str):
        return _parse_number(value) is not None
    return False


def value_type(value: Any) -> str:
    """The column type a single value calls for."""
    if isinstance(value, bool) or not is_number(value):
        return TEXT
    if isinstance(value, int):
        return INT
    if isinstance(value, str) and isinstance(_parse_number(value), int):
        return INT
    return FLOAT


def column_type(values: Iterable[Any]) -> str:
    """The most specific type that fits every value of a column.

    ``None`` is a missing value and does not make a column textual.
    """
    order = {INT: 0, FLOAT: 1, TEXT: 2}
    result = INT
    seen = False
    for value in values:
        if value is None:
            continue
        seen = True
        kind = value_type(value)
        if order[kind] > order[result]:
            result = kind
    return result if seen else TEXT


def format_cell(value: Any, column: str = TEXT, floatfmt: str = "g", missing: str = "") -> str:
    """The text shown for ``value`` in a column of type ``column``."""
    if value is None:
        return missing
    if column == FLOAT and is_number(value):
        number = float(value) if isinstance(value, str) else value
        return format(number, floatfmt)
    if column == INT and isinstance(value, str):
        return value.strip()
    return str(value)


def align_decimal(cells: Sequence[str]) -> list[str]:
    """Pad numeric strings so that their decimal points line up.

    Cells that are empty (missing values) are left alone; the caller pads
    everything to the column width afterwards.
    """
    points = [cell.find(".") for cell in cells]
    before = max((p for cell, p in zip(cells, points) if cell), default=0)
    after = max((len(cell) - p for cell, p in zip(cells, points) if cell), default=0)
    out = []
    for cell, point in zip(cells, points):
        if not cell:
            out.append(cell)
            continue
        out.append(" " * (before - point) + cell + " " * (after - (len(cell) - point)))
    return out
