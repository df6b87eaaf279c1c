"""Version ranges, in the syntax npm made familiar.

* comparators: ``>=1.2.3``, ``<2.0.0``, ``=1.0.0``, ``1.0.0``;
* caret: ``^1.2.3`` allows changes that do not modify the left-most
  non-zero number;
* tilde: ``~1.2.3`` allows patch-level changes;
* wildcards: ``1.2.x``, ``1.*``, ``*``;
* hyphen ranges: ``1.2.3 - 2.3.4`` (both ends included);
* whitespace between comparators means *and*, ``||`` means *or*.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Optional

from .version import Version, VersionLike, as_version


class InvalidRange(ValueError):
    """The text is not a version range."""


_OPERATORS = ("<=", ">=", "<", ">", "=")
_PARTIAL_RE = re.compile(
    r"^v?(?P<major>\d+|[xX*])(?:\.(?P<minor>\d+|[xX*]))?(?:\.(?P<patch>\d+|[xX*]))?"
    r"(?:-(?P<prerelease>[0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$"
)
_HYPHEN_RE = re.compile(r"^\s*(\S+)\s+-\s+(\S+)\s*$")
_WILDCARDS = {"x", "X", "*"}


@dataclass(frozen=True)
class Comparator:
    """One ``<operator><version>`` test."""

    operator: str
    version: Version

    def matches(self, version: Version) -> bool:
        c = version.compare(self.version)
        return {
            "<": c < 0,
            "<=": c <= 0,
            ">": c > 0,
            ">=": c >= 0,
            "=": c == 0,
        }[self.operator]

    def __str__(self) -> str:
        return f"{self.operator}{self.version}"


@dataclass(frozen=True)
class _Partial:
    """A version with possibly missing numbers: ``1``, ``1.2``, ``1.2.x``."""

    major: Optional[int]
    minor: Optional[int]
    patch: Optional[int]
    prerelease: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> "_Partial":
        match = _PARTIAL_RE.match(text)
        if not match:
            raise InvalidRange(f"not a version: {text!r}")

        def number(name: str) -> Optional[int]:
            value = match.group(name)
            return None if value is None or value in _WILDCARDS else int(value)

        major, minor, patch = number("major"), number("minor"), number("patch")
        if major is None:
            minor = patch = None
        elif minor is None:
            patch = None
        pre = match.group("prerelease")
        return cls(major, minor, patch, tuple(pre.split(".")) if pre else ())

    def floor(self) -> Version:
        return Version(self.major or 0, self.minor or 0, self.patch or 0, self.prerelease)


def _desugar(term: str) -> list[Comparator]:
    """Expand one space-separated term (``^1.2``, ``>=1.0``, ``1.x``...) into comparators."""
    if term.startswith("^"):
        return _caret(_Partial.parse(term[1:]))
    if term.startswith("~"):
        return _tilde(_Partial.parse(term[1:]))
    for op in _OPERATORS:
        if term.startswith(op):
            partial = _Partial.parse(term[len(op):].strip())
            return _with_operator(op, partial)
    return _x_range(_Partial.parse(term))


def _x_range(p: _Partial) -> list[Comparator]:
    if p.major is None:
        return []  # "*" matches everything
    if p.minor is None:
        return [
            Comparator(">=", Version(p.major, 0, 0)),
            Comparator("<", Version(p.major + 1, 0, 0)),
        ]
    if p.patch is None:
        return [
            Comparator(">=", Version(p.major, p.minor, 0)),
            Comparator("<", Version(p.major, p.minor + 1, 0)),
        ]
    return [Comparator("=", p.floor())]


def _with_operator(op: str, p: _Partial) -> list[Comparator]:
    if p.major is None:
        # ">=*" matches everything, "<*" nothing
        return [] if op in (">=", "<=", "=") else [Comparator("<", Version(0, 0, 0))]
    if p.minor is not None and p.patch is not None:
        return [Comparator(op, p.floor())]
    if op == "=":
        return _x_range(p)
    # a partial bound: ">1.2" means ">=1.3.0", "<=1.2" means "<1.3.0"
    upper = Version(p.major + 1, 0, 0) if p.minor is None else Version(p.major, p.minor + 1, 0)
    if op == ">":
        return [Comparator(">=", upper)]
    if op == "<=":
        return [Comparator("<", upper)]
    return [Comparator(op, p.floor())]


def _caret(p: _Partial) -> list[Comparator]:
    if p.major is None:
        return []
    lower = Comparator(">=", p.floor())
    return [lower, Comparator("<", Version(p.major + 1, 0, 0))]


def _tilde(p: _Partial) -> list[Comparator]:
    if p.major is None:
        return []
    lower = Comparator(">=", p.floor())
    if p.minor is None:
        return [lower, Comparator("<", Version(p.major + 1, 0, 0))]
    return [lower, Comparator("<", Version(p.major, p.minor + 1, 0))]


def _hyphen(low: str, high: str) -> list[Comparator]:
    lo, hi = _Partial.parse(low), _Partial.parse(high)
    comparators = [] if lo.major is None else [Comparator(">=", lo.floor())]
    if hi.major is None:
        return comparators
    if hi.minor is None:
        return comparators + [Comparator("<", Version(hi.major + 1, 0, 0))]
    if hi.patch is None:
        return comparators + [Comparator("<", Version(hi.major, hi.minor + 1, 0))]
    return comparators + [Comparator("<=", hi.floor())]


class Range:
    """A set of versions described by a range expression.

    >>> r = Range("^1.2.0 || >=3.0.0 <3.5.0")
    >>> r.contains("1.9.9"), r.contains("2.0.0"), r.contains("3.1.0")
    (True, False, True)
    >>> str(r.max_satisfying(["1.2.0", "1.8.1", "3.4.0", "3.6.0"]))
    '3.4.0'
    """

    def __init__(self, text: str):
        self.text = text
        self.sets: list[list[Comparator]] = []
        for alternative in text.split("||"):
            self.sets.append(self._parse_set(alternative))

    @staticmethod
    def _parse_set(text: str) -> list[Comparator]:
        if not text.strip():
            return []
        hyphen = _HYPHEN_RE.match(text)
        if hyphen:
            return _hyphen(hyphen.group(1), hyphen.group(2))
        # "> = 1.2" and ">= 1.2" are common typos for ">=1.2"
        text = re.sub(r"(<=|>=|<|>|=|\^|~)\s+", r"\1", text)
        comparators: list[Comparator] = []
        for term in text.split():
            comparators.extend(_desugar(term))
        return comparators

    def contains(self, version: VersionLike) -> bool:
        """Does ``version`` satisfy the range?"""
        v = as_version(version)
        return any(all(c.matches(v) for c in comparators) for comparators in self.sets)

    __contains__ = contains

    def filter(self, versions: Iterable[VersionLike]) -> list[Version]:
        """The versions that satisfy the range, in the order given."""
        return [v for v in map(as_version, versions) if self.contains(v)]

    def max_satisfying(self, versions: Iterable[VersionLike]) -> Optional[Version]:
        return max(self.filter(versions), default=None)

    def min_satisfying(self, versions: Iterable[VersionLike]) -> Optional[Version]:
        return min(self.filter(versions), default=None)

    def __str__(self) -> str:
        return " || ".join(" ".join(str(c) for c in cs) or "*" for cs in self.sets)

    def __repr__(self) -> str:
        return f"Range({self.text!r})"


def satisfies(version: VersionLike, range_text: str) -> bool:
    """Shortcut for ``Range(range_text).contains(version)``."""
    return Range(range_text).contains(version)
