"""Intervals over anything that can be ordered: numbers, dates, datetimes.

An :class:`Interval` has a lower and an upper bound, each either closed
(the bound belongs to the interval) or open.  The default is half-open,
``[lo, hi)``, which is what you want for time spans: ``[9:00, 10:00)`` and
``[10:00, 11:00)`` share no instant.
"""

from __future__ import annotations

from functools import total_ordering
from typing import Any


def _below(lo: Any, lo_closed: bool, hi: Any, hi_closed: bool) -> bool:
    """Is there room between a lower bound and an upper bound?

    True when some point is at or after ``lo`` and at or before ``hi``,
    taking open and closed bounds into account.
    """
    if lo < hi:
        return True
    if lo == hi:
        return lo_closed or hi_closed
    return False


@total_ordering
class Interval:
    """A contiguous range of values between ``lo`` and ``hi``.

    >>> Interval(1, 5)
    Interval(1, 5, '[)')
    >>> 5 in Interval(1, 5), 5 in Interval(1, 5, hi_closed=True)
    (False, True)
    """

    __slots__ = ("lo", "hi", "lo_closed", "hi_closed")

    def __init__(self, lo: Any, hi: Any, lo_closed: bool = True, hi_closed: bool = False):
        if hi < lo:
            raise ValueError(f"interval bounds out of order: {lo!r} > {hi!r}")
        self.lo = lo
        self.hi = hi
        self.lo_closed = bool(lo_closed)
        self.hi_closed = bool(hi_closed)

    @classmethod
    def closed(cls, lo: Any, hi: Any) -> "Interval":
        return cls(lo, hi, True, True)

    @classmethod
    def open(cls, lo: Any, hi: Any) -> "Interval":
        return cls(lo, hi, False, False)

    @classmethod
    def point(cls, value: Any) -> "Interval":
        return cls(value, value, True, True)

    # -- basic properties ---------------------------------------------------

    @property
    def brackets(self) -> str:
        return ("[" if self.lo_closed else "(") + ("]" if self.hi_closed else ")")

    @property
    def is_empty(self) -> bool:
        """``[x, x)``, ``(x, x]`` and ``(x, x)`` contain nothing."""
        return self.lo == self.hi and not (self.lo_closed and self.hi_closed)

    @property
    def length(self) -> Any:
        """``hi - lo`` (a ``timedelta`` for dates)."""
        return self.hi - self.lo

    def __contains__(self, value: Any) -> bool:
        if value < self.lo or value > self.hi:
            return False
        if value == self.lo and not self.lo_closed:
            return False
        if value == self.hi and not self.hi_closed:
            return False
        return True

    # -- relations ----------------------------------------------------------

    def overlaps(self, other: "Interval") -> bool:
        """Do the two intervals share at least one point?"""
        if self.is_empty or other.is_empty:
            return False
        return _below(self.lo, self.lo_closed, other.hi, other.hi_closed) and _below(
            other.lo, other.lo_closed, self.hi, self.hi_closed
        )

    def is_adjacent(self, other: "Interval") -> bool:
        """Do the intervals touch without overlapping, like ``[1, 3)`` and ``[3, 5)``?"""
        if self.is_empty or other.is_empty:
            return False
        if self.hi == other.lo:
            return self.hi_closed != other.lo_closed
        if other.hi == self.lo:
            return other.hi_closed != self.lo_closed
        return False

    def contains_interval(self, other: "Interval") -> bool:
        """Is every point of ``other`` in this interval?"""
        if other.is_empty:
            return True
        lo_ok = self.lo < other.lo or (
            self.lo == other.lo and (self.lo_closed or not other.lo_closed)
        )
        hi_ok = other.hi < self.hi or (
            self.hi == other.hi and (self.hi_closed or not other.hi_closed)
        )
        return lo_ok and hi_ok

    # -- operations -----------------------------------------------------------

    def intersection(self, other: "Interval") -> "Interval | None":
        """The common part, or ``None`` when the intervals do not overlap."""
        if not self.overlaps(other):
            return None
        if self.lo > other.lo or (self.lo == other.lo and not self.lo_closed):
            lo, lo_closed = self.lo, self.lo_closed
        else:
            lo, lo_closed = other.lo, other.lo_closed
        if self.hi < other.hi or (self.hi == other.hi and not self.hi_closed):
            hi, hi_closed = self.hi, self.hi_closed
        else:
            hi, hi_closed = other.hi, other.hi_closed
        return Interval(lo, hi, lo_closed, hi_closed)

    def union(self, other: "Interval") -> "Interval":
        """The smallest interval covering both; they must overlap or touch."""
        if not (self.overlaps(other) or self.is_adjacent(other)):
            raise ValueError(f"{self} and {other} are disjoint; use an IntervalSet")
        return self.hull(other)

    def hull(self, other: "Interval") -> "Interval":
        """The smallest interval covering both, gaps included."""
        if self.lo < other.lo or (self.lo == other.lo and self.lo_closed):
            lo, lo_closed = self.lo, self.lo_closed
        else:
            lo, lo_closed = other.lo, other.lo_closed
        if self.hi > other.hi or (self.hi == other.hi and self.hi_closed):
            hi, hi_closed = self.hi, self.hi_closed
        else:
            hi, hi_closed = other.hi, other.hi_closed
        return Interval(lo, hi, lo_closed, hi_closed)

    def shift(self, delta: Any) -> "Interval":
        return Interval(self.lo + delta, self.hi + delta, self.lo_closed, self.hi_closed)

    # -- dunder -------------------------------------------------------------

    def _key(self) -> tuple:
        return (self.lo, not self.lo_closed, self.hi, self.hi_closed)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Interval):
            return NotImplemented
        return self._key() == other._key()

    def __lt__(self, other: "Interval") -> bool:
        if not isinstance(other, Interval):
            return NotImplemented
        return self._key() < other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"Interval({self.lo!r}, {self.hi!r}, {self.brackets!r})"

    def __str__(self) -> str:
        b = self.brackets
        return f"{b[0]}{self.lo}, {self.hi}{b[1]}"
