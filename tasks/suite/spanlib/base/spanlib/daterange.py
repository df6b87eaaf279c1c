"""Calendar date ranges.

A :class:`DateRange` is inclusive at both ends, the way people talk about
dates: "from 1 March to 31 March" includes both days.  Use
:meth:`DateRange.to_interval` for the half-open :class:`~spanlib.Interval`
equivalent.
"""

from __future__ import annotations

import calendar
import re
from datetime import date, timedelta
from typing import Iterable, Iterator

from .interval import Interval

ONE_DAY = timedelta(days=1)
_RANGE_RE = re.compile(r"^\s*(\d{4}-\d{2}-\d{2})\s*(?:\.\.|/)\s*(\d{4}-\d{2}-\d{2})\s*$")


def add_months(day: date, months: int) -> date:
    """``day`` moved by a number of months, clamped to the end of the month.

    >>> add_months(date(2024, 1, 31), 1)
    datetime.date(2024, 2, 29)
    """
    index = day.year * 12 + (day.month - 1) + months
    year, month = divmod(index, 12)
    last = calendar.monthrange(year, month + 1)[1]
    return date(year, month + 1, min(day.day, last))


def month_start(day: date) -> date:
    return day.replace(day=1)


def month_end(day: date) -> date:
    return day.replace(day=calendar.monthrange(day.year, day.month)[1])


class DateRange:
    """The days from ``start`` to ``end``, both included.

    >>> r = DateRange(date(2024, 2, 27), date(2024, 3, 2))
    >>> len(r)
    5
    >>> str(r)
    '2024-02-27..2024-03-02'
    """

    __slots__ = ("start", "end")

    def __init__(self, start: date, end: date):
        if end < start:
            raise ValueError(f"date range ends before it starts: {start} > {end}")
        self.start = start
        self.end = end

    @classmethod
    def parse(cls, text: str) -> "DateRange":
        """Read ``YYYY-MM-DD..YYYY-MM-DD`` (or ISO 8601's ``start/end``)."""
        match = _RANGE_RE.match(text)
        if not match:
            raise ValueError(f"not a date range: {text!r}")
        return cls(date.fromisoformat(match.group(1)), date.fromisoformat(match.group(2)))

    @classmethod
    def month(cls, year: int, month: int) -> "DateRange":
        first = date(year, month, 1)
        return cls(first, month_end(first))

    # -- basics ---------------------------------------------------------------

    def __len__(self) -> int:
        return (self.end - self.start).days + 1

    def __iter__(self) -> Iterator[date]:
        day = self.start
        while day <= self.end:
            yield day
            day += ONE_DAY

    def __contains__(self, day: date) -> bool:
        return self.start <= day <= self.end

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DateRange):
            return NotImplemented
        return (self.start, self.end) == (other.start, other.end)

    def __hash__(self) -> int:
        return hash((self.start, self.end))

    def __repr__(self) -> str:
        return f"DateRange({self.start!r}, {self.end!r})"

    def __str__(self) -> str:
        return f"{self.start.isoformat()}..{self.end.isoformat()}"

    def to_interval(self) -> Interval:
        """The half-open interval ``[start, end + 1 day)``."""
        return Interval(self.start, self.end + ONE_DAY)

    # -- iteration --------------------------------------------------------------

    def step(self, *, days: int = 0, weeks: int = 0, months: int = 0) -> Iterator[date]:
        """Every date from ``start`` to ``end`` at a fixed stride.

        With ``months``, a day that does not exist in a month (the 31st,
        say) is clamped to the last day of that month.
        """
        if days < 0 or weeks < 0 or months < 0:
            raise ValueError("the step must be positive")
        delta = timedelta(days=days, weeks=weeks)
        if not delta and not months:
            raise ValueError("the step must be positive")
        current = self.start
        while current <= self.end:
            yield current
            if months:
                current = add_months(current, months)
            current += delta

    def weekdays(self) -> Iterator[date]:
        """The days from Monday to Friday."""
        return (day for day in self if day.weekday() < 5)

    def business_days(self, holidays: Iterable[date] = ()) -> int:
        """Number of weekdays in the range that are not holidays."""
        count = sum(1 for _ in self.weekdays())
        closed = [day for day in holidays if day in self]
        return count - len(closed)

    # -- relations ----------------------------------------------------------------

    def overlap(self, other: "DateRange") -> "DateRange | None":
        """The days both ranges share, or ``None``."""
        start = max(self.start, other.start)
        end = min(self.end, other.end)
        if end < start:
            return None
        return DateRange(start, end)

    def shift(self, days: int) -> "DateRange":
        delta = timedelta(days=days)
        return DateRange(self.start + delta, self.end + delta)

    # -- splitting ----------------------------------------------------------------

    def split_by_month(self) -> list["DateRange"]:
        """The range cut at month boundaries; first and last pieces may be partial."""
        pieces = []
        start = self.start
        while start <= self.end:
            end = min(month_end(start), self.end)
            pieces.append(DateRange(start, end))
            start = end + ONE_DAY
        return pieces
