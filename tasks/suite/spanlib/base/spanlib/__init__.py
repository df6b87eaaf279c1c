"""spanlib: intervals, interval sets and calendar date ranges.

>>> from spanlib import Interval, IntervalSet
>>> busy = IntervalSet([Interval(9, 11), Interval(10, 12), Interval(14, 15)])
>>> list(busy)
[Interval(9, 12, '[)'), Interval(14, 15, '[)')]
>>> busy.complement(Interval(8, 18))
IntervalSet([Interval(8, 9, '[)'), Interval(12, 14, '[)'), Interval(15, 18, '[)')])
"""

from .daterange import DateRange, add_months, month_end, month_start
from .interval import Interval
from .intervalset import IntervalSet
from .parse import format_interval, parse_interval

__version__ = "1.2.0"

__all__ = [
    "DateRange",
    "Interval",
    "IntervalSet",
    "add_months",
    "format_interval",
    "month_end",
    "month_start",
    "parse_interval",
]
