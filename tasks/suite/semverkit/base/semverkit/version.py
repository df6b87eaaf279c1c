"""Semantic versions (https://semver.org, 2.0.0)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import total_ordering
from typing import Union

_NUM = r"0|[1-9]\d*"
_IDENT = r"[0-9A-Za-z-]+"
_VERSION_RE = re.compile(
    rf"^(?P<major>{_NUM})\.(?P<minor>{_NUM})\.(?P<patch>{_NUM})"
    rf"(?:-(?P<prerelease>{_IDENT}(?:\.{_IDENT})*))?"
    rf"(?:\+(?P<build>{_IDENT}(?:\.{_IDENT})*))?$"
)
_COERCE_RE = re.compile(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?")

#: the parts :meth:`Version.bump` understands, most significant first
PARTS = ("major", "minor", "patch", "prerelease")


class InvalidVersion(ValueError):
    """The text is not a semantic version."""


def _check_identifiers(identifiers: tuple[str, ...], what: str, text: str) -> None:
    for ident in identifiers:
        if what == "prerelease" and ident.isdigit() and len(ident) > 1 and ident[0] == "0":
            raise InvalidVersion(
                f"{text!r}: numeric {what} identifier {ident!r} has a leading zero"
            )


@total_ordering
@dataclass(frozen=True)
class Version:
    """A parsed semantic version.

    >>> v = Version.parse("1.4.0-rc.1+build.7")
    >>> v.major, v.minor, v.patch, v.prerelease, v.build
    (1, 4, 0, ('rc', '1'), ('build', '7'))
    >>> str(v.bump("minor"))
    '1.5.0'
    """

    major: int
    minor: int = 0
    patch: int = 0
    prerelease: tuple[str, ...] = field(default=())
    build: tuple[str, ...] = field(default=())

    def __post_init__(self):
        for name in ("major", "minor", "patch"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidVersion(f"{name} must be a non-negative integer, not {value!r}")
        object.__setattr__(self, "prerelease", tuple(str(p) for p in self.prerelease))
        object.__setattr__(self, "build", tuple(str(b) for b in self.build))

    # -- construction ---------------------------------------------------------

    @classmethod
    def parse(cls, text: str) -> "Version":
        """Parse a strict semantic version; a leading ``v`` is tolerated."""
        if not isinstance(text, str):
            raise TypeError(f"expected a string, not {type(text).__name__}")
        stripped = text.strip()
        if stripped[:1] in ("v", "V"):
            stripped = stripped[1:]
        match = _VERSION_RE.match(stripped)
        if not match:
            raise InvalidVersion(f"not a semantic version: {text!r}")
        pre, build_text = match.group("prerelease"), match.group("build")
        prerelease = tuple(pre.split(".")) if pre else ()
        build = tuple(build_text.split(".")) if build_text else ()
        _check_identifiers(prerelease, "prerelease", text)
        return cls(
            int(match.group("major")),
            int(match.group("minor")),
            int(match.group("patch")),
            prerelease,
            build,
        )

    @classmethod
    def coerce(cls, text: str) -> "Version":
        """Find something version-like in ``text``: ``"v2.1"`` -> ``2.1.0``.

        Missing minor and patch numbers are zero; prerelease and build
        information is dropped.
        """
        match = _COERCE_RE.search(text)
        if not match:
            raise InvalidVersion(f"no version found in {text!r}")
        major, minor, patch = (int(g) if g is not None else 0 for g in match.groups())
        return cls(major, minor, patch)

    # -- derived versions -------------------------------------------------------

    @property
    def is_prerelease(self) -> bool:
        return bool(self.prerelease)

    @property
    def release(self) -> "Version":
        """The same version without prerelease and build information."""
        return Version(self.major, self.minor, self.patch)

    def bump(self, part: str, token: str = "rc") -> "Version":
        """The next version after this one.

        ``major``, ``minor`` and ``patch`` reset the less significant numbers.
        A prerelease is followed by its release for the part that was
        already bumped: ``1.3.0-rc.1`` bumps to ``1.3.0`` for ``minor`` and
        ``patch``.  ``prerelease`` increments the last numeric identifier
        (``rc.1`` -> ``rc.2``), or starts ``<token>.1`` on the next patch.
        """
        if part == "major":
            if self.prerelease and self.minor == 0 and self.patch == 0:
                return Version(self.major, 0, 0)
            return Version(self.major + 1, 0, 0)
        if part == "minor":
            if self.prerelease and self.patch == 0:
                return Version(self.major, self.minor, 0)
            return Version(self.major, self.minor + 1, 0)
        if part == "patch":
            if self.prerelease:
                return Version(self.major, self.minor, self.patch)
            return Version(self.major, self.minor, self.patch + 1)
        if part == "prerelease":
            if not self.prerelease:
                return Version(self.major, self.minor, self.patch + 1, (token, "1"))
            ids = list(self.prerelease)
            for i in range(len(ids) - 1, -1, -1):
                if ids[i].isdigit():
                    ids[i] = str(int(ids[i]) + 1)
                    break
            else:
                ids.append("1")
            return Version(self.major, self.minor, self.patch, tuple(ids))
        raise ValueError(f"unknown part {part!r}; expected one of {', '.join(PARTS)}")

    # -- comparison -------------------------------------------------------------

    def _precedence(self) -> tuple:
        # a version without prerelease ranks above all of its prereleases
        return (
            self.major,
            self.minor,
            self.patch,
            0 if self.prerelease else 1,
            self.prerelease,
        )

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._precedence() < other._precedence()

    def compare(self, other: "Version") -> int:
        """-1, 0 or 1, by precedence."""
        a, b = self._precedence(), other._precedence()
        return (a > b) - (a < b)

    # -- text -------------------------------------------------------------------

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.prerelease:
            text += "-" + ".".join(self.prerelease)
        if self.build:
            text += "+" + ".".join(self.build)
        return text

    def __repr__(self) -> str:
        return f"Version({str(self)!r})"


VersionLike = Union[Version, str]


def as_version(value: VersionLike) -> Version:
    """Accept a :class:`Version` or a string."""
    return value if isinstance(value, Version) else Version.parse(value)
