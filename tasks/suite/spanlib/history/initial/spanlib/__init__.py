"""spanlib: intervals and sets of intervals."""

from .interval import Interval
from .intervalset import IntervalSet
from .parse import format_interval, parse_interval

__version__ = "1.0.0"

__all__ = ["Interval", "IntervalSet", "format_interval", "parse_interval"]
