"""``${...}`` references between values.

Two forms are understood:

``${key}``
    another key of the same section (or of ``DEFAULT``);
``${section:key}``
    a key of another section.

``$$`` produces a literal dollar sign.  References are resolved when a value
is read, so overriding a value later changes everything that refers to it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from .errors import InterpolationError, MissingKeyError, MissingSectionError

if TYPE_CHECKING:  # pragma: no cover
    from .config import Config

MAX_DEPTH = 16

_TOKEN_RE = re.compile(r"\$(?:\$|\{(?P<ref>[^{}]*)\})")
_REF_RE = re.compile(r"^(?:(?P<section>[^:]+):)?(?P<key>[A-Za-z0-9_.\-]+)$")


def references(value: str) -> list[tuple[str | None, str]]:
    """The ``(section, key)`` pairs a raw value refers to, in order."""
    refs = []
    for match in _TOKEN_RE.finditer(value):
        ref = match.group("ref")
        if ref is None:
            continue
        parsed = _REF_RE.match(ref.strip())
        if parsed:
            refs.append((parsed.group("section"), parsed.group("key").lower()))
    return refs


def interpolate(config: "Config", section: str, key: str, value: str, depth: int = 0) -> str:
    """Expand every reference in ``value``, which was read from ``[section] key``."""
    if depth > MAX_DEPTH:
        raise InterpolationError(
            f"references nested deeper than {MAX_DEPTH} levels (cycle?)", section, key
        )

    def replace(match: re.Match) -> str:
        ref = match.group("ref")
        if ref is None:
            return "$"
        parsed = _REF_RE.match(ref.strip())
        if not parsed:
            raise InterpolationError(f"bad reference ${{{ref}}}", section, key)
        target_section = (parsed.group("section") or section).strip()
        target_key = parsed.group("key").lower()
        try:
            raw = config.get_raw(target_section, target_key)
        except (MissingSectionError, MissingKeyError) as exc:
            raise InterpolationError(f"${{{ref}}}: {exc}", section, key) from None
        return interpolate(config, target_section, target_key, raw, depth)

    return _TOKEN_RE.sub(replace, value)
