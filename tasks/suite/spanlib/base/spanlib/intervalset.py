"""Sets of disjoint intervals, kept merged and sorted."""

from __future__ import annotations

from bisect import bisect_right
from typing import Any, Iterable, Iterator

from .interval import Interval


def _subtract(a: Interval, b: Interval) -> list[Interval]:
    """``a`` without the points of ``b``: nothing, one piece or two."""
    if not a.overlaps(b):
        return [a]
    pieces = []
    # the part of a before b starts
    if a.lo < b.lo or (a.lo == b.lo and a.lo_closed and not b.lo_closed):
        pieces.append(Interval(a.lo, b.lo, a.lo_closed, not b.lo_closed))
    # the part of a after b ends
    elif b.hi < a.hi or (b.hi == a.hi and a.hi_closed and not b.hi_closed):
        pieces.append(Interval(b.hi, a.hi, not b.hi_closed, a.hi_closed))
    return [p for p in pieces if not p.is_empty]


class IntervalSet:
    """A set of points described by disjoint, non-adjacent intervals.

    >>> s = IntervalSet([Interval(1, 3), Interval(2, 5), Interval(8, 9)])
    >>> s
    IntervalSet([Interval(1, 5, '[)'), Interval(8, 9, '[)')])
    >>> 4 in s, 6 in s
    (True, False)
    """

    def __init__(self, intervals: Iterable[Interval] = ()):
        self._items: list[Interval] = []
        for interval in intervals:
            self.add(interval)

    # -- mutation -----------------------------------------------------------

    def add(self, interval: Interval) -> None:
        """Add the points of ``interval``, merging what overlaps or touches."""
        if interval.is_empty:
            return
        merged = interval
        keep = []
        for item in self._items:
            if merged.overlaps(item) or merged.is_adjacent(item):
                merged = merged.hull(item)
            else:
                keep.append(item)
        keep.append(merged)
        keep.sort()
        self._items = keep

    def discard(self, interval: Interval) -> None:
        """Remove the points of ``interval`` (those that are present)."""
        result = []
        for item in self._items:
            result.extend(_subtract(item, interval))
        self._items = result

    # -- queries --------------------------------------------------------------

    def __contains__(self, value: Any) -> bool:
        starts = [item.lo for item in self._items]
        index = bisect_right(starts, value) - 1
        return index >= 0 and value in self._items[index]

    def __iter__(self) -> Iterator[Interval]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, IntervalSet):
            return NotImplemented
        return self._items == other._items

    def __repr__(self) -> str:
        return f"IntervalSet({self._items!r})"

    def span(self) -> Interval | None:
        """The smallest interval covering the whole set, or ``None`` if empty."""
        if not self._items:
            return None
        return self._items[0].hull(self._items[-1])

    def total_length(self, zero: Any = 0) -> Any:
        """Sum of the lengths; pass ``zero=timedelta(0)`` for dates."""
        total = zero
        for item in self._items:
            total = total + item.length
        return total

    # -- set algebra ----------------------------------------------------------

    def copy(self) -> "IntervalSet":
        new = IntervalSet()
        new._items = list(self._items)
        return new

    def union(self, other: "IntervalSet") -> "IntervalSet":
        result = self.copy()
        for item in other:
            result.add(item)
        return result

    def difference(self, other: "IntervalSet") -> "IntervalSet":
        result = self.copy()
        for item in other:
            result.discard(item)
        return result

    def intersection(self, other: "IntervalSet") -> "IntervalSet":
        result = IntervalSet()
        for a in self._items:
            for b in other:
                common = a.intersection(b)
                if common is not None:
                    result.add(common)
        return result

    def complement(self, within: Interval) -> "IntervalSet":
        """The points of ``within`` that are not in this set."""
        return IntervalSet([within]).difference(self)

    __or__ = union
    __and__ = intersection
    __sub__ = difference
