"""The :class:`Config` object: sections, defaults, typed getters."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from typing import Any, Callable, TypeVar

from . import parser
from .errors import MissingKeyError, MissingSectionError
from .interpolation import interpolate

DEFAULT_SECTION = "DEFAULT"

T = TypeVar("T")

_MISSING: Any = object()

BOOLEAN_STATES = {
    "1": True,
    "yes": True,
    "true": True,
    "on": True,
    "0": False,
    "no": False,
    "false": False,
    "off": False,
}

_LIST_SPLIT_RE = re.compile(r"[,\n]")


class Section(Mapping[str, str]):
    """A read/write view of one section.

    Reading a key falls back to the ``DEFAULT`` section, and values are
    interpolated unless the owning :class:`Config` was created with
    ``interpolation=False``.
    """

    def __init__(self, config: "Config", name: str):
        self._config = config
        self.name = name

    def __getitem__(self, key: str) -> str:
        return self._config.get(self.name, key)

    def __setitem__(self, key: str, value: Any) -> None:
        self._config.set(self.name, key, value)

    def __delitem__(self, key: str) -> None:
        self._config.remove(self.name, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._config.keys(self.name))

    def __len__(self) -> int:
        return len(self._config.keys(self.name))

    def __repr__(self) -> str:
        return f"<Section {self.name!r}>"

    def getint(self, key: str, fallback: Any = _MISSING) -> int:
        return self._config.getint(self.name, key, fallback)

    def getfloat(self, key: str, fallback: Any = _MISSING) -> float:
        return self._config.getfloat(self.name, key, fallback)

    def getbool(self, key: str, fallback: Any = _MISSING) -> bool:
        return self._config.getbool(self.name, key, fallback)

    def getlist(self, key: str, fallback: Any = _MISSING) -> list[str]:
        return self._config.getlist(self.name, key, fallback)


class Config:
    """A parsed configuration.

    >>> cfg = Config.loads("[db]\\nhost = localhost\\nport = 5432\\n")
    >>> cfg.getint("db", "port")
    5432
    """

    def __init__(self, *, interpolation: bool = True):
        self.interpolation = interpolation
        self._data: dict[str, dict[str, str]] = {DEFAULT_SECTION: {}}

    # -- construction -----------------------------------------------------

    @classmethod
    def loads(cls, text: str, *, source: str = "<string>", strict: bool = True,
              interpolation: bool = True) -> "Config":
        config = cls(interpolation=interpolation)
        config.read_string(text, source=source, strict=strict)
        return config

    @classmethod
    def load(cls, path: str | os.PathLike, *, strict: bool = True,
             interpolation: bool = True) -> "Config":
        with open(path, encoding="utf-8") as fh:
            return cls.loads(fh.read(), source=os.fspath(path), strict=strict,
                             interpolation=interpolation)

    def read_string(self, text: str, *, source: str = "<string>", strict: bool = True) -> None:
        """Parse ``text`` and merge it into this configuration."""
        for raw in parser.parse(text, source=source, strict=strict):
            self._data.setdefault(raw.name, {}).update(raw.as_dict())

    def merge(self, other: "Config") -> None:
        """Copy every raw value of ``other`` over this configuration."""
        for name, values in other._data.items():
            self._data.setdefault(name, {}).update(values)

    # -- structure --------------------------------------------------------

    def sections(self) -> list[str]:
        """Section names in insertion order, without ``DEFAULT``."""
        return [name for name in self._data if name != DEFAULT_SECTION]

    def has_section(self, name: str) -> bool:
        return name in self._data

    def add_section(self, name: str) -> Section:
        if name in self._data:
            raise ValueError(f"section {name!r} already exists")
        self._data[name] = {}
        return Section(self, name)

    def remove_section(self, name: str) -> None:
        if name == DEFAULT_SECTION or name not in self._data:
            raise MissingSectionError(name)
        del self._data[name]

    def __getitem__(self, name: str) -> Section:
        if name not in self._data:
            raise MissingSectionError(name)
        return Section(self, name)

    def __contains__(self, name: object) -> bool:
        return name in self._data

    def __iter__(self) -> Iterator[str]:
        return iter(self.sections())

    def keys(self, section: str) -> list[str]:
        """Keys visible in ``section``: its own, then inherited defaults."""
        own = self._section(section)
        inherited = [k for k in self._data[DEFAULT_SECTION] if k not in own]
        return list(own) + (inherited if section != DEFAULT_SECTION else [])

    def _section(self, name: str) -> dict[str, str]:
        try:
            return self._data[name]
        except KeyError:
            raise MissingSectionError(name) from None

    # -- values -----------------------------------------------------------

    def get_raw(self, section: str, key: str) -> str:
        """The value as written, before interpolation."""
        key = key.lower()
        values = self._section(section)
        if key in values:
            return values[key]
        if key in self._data[DEFAULT_SECTION]:
            return self._data[DEFAULT_SECTION][key]
        raise MissingKeyError(section, key)

    def get(self, section: str, key: str, fallback: Any = _MISSING) -> Any:
        """The interpolated value, or ``fallback`` if the key does not exist."""
        try:
            raw = self.get_raw(section, key)
        except (MissingKeyError, MissingSectionError):
            if fallback is _MISSING:
                raise
            return fallback
        if not self.interpolation:
            return raw
        return interpolate(self, section, key.lower(), raw)

    def _convert(self, section: str, key: str, convert: Callable[[str], T], fallback: Any) -> T:
        value = self.get(section, key, fallback)
        if value is fallback and fallback is not _MISSING:
            return fallback
        try:
            return convert(value)
        except ValueError as exc:
            raise ValueError(f"[{section}] {key}: {exc}") from None

    def getint(self, section: str, key: str, fallback: Any = _MISSING) -> int:
        return self._convert(section, key, lambda v: int(v.strip(), 0), fallback)

    def getfloat(self, section: str, key: str, fallback: Any = _MISSING) -> float:
        return self._convert(section, key, float, fallback)

    def getbool(self, section: str, key: str, fallback: Any = _MISSING) -> bool:
        def convert(value: str) -> bool:
            try:
                return BOOLEAN_STATES[value.strip().lower()]
            except KeyError:
                raise ValueError(f"not a boolean: {value!r}") from None

        return self._convert(section, key, convert, fallback)

    def getlist(self, section: str, key: str, fallback: Any = _MISSING) -> list[str]:
        """Split a value on commas and newlines, stripping each item."""
        return self._convert(
            section, key, lambda v: [item.strip() for item in _LIST_SPLIT_RE.split(v)], fallback
        )

    def set(self, section: str, key: str, value: Any) -> None:
        """Set a value; non-strings are stored as ``str(value)`` (booleans lower-cased)."""
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif not isinstance(value, str):
            value = str(value)
        self._section(section)[key.lower()] = value

    def remove(self, section: str, key: str) -> None:
        values = self._section(section)
        try:
            del values[key.lower()]
        except KeyError:
            raise MissingKeyError(section, key) from None

    def to_dict(self, *, raw: bool = False) -> dict[str, dict[str, str]]:
        """Plain nested dicts, ``DEFAULT`` included when it is not empty."""
        out = {}
        for name, values in self._data.items():
            if name == DEFAULT_SECTION and not values:
                continue
            if raw or not self.interpolation:
                out[name] = dict(values)
            else:
                out[name] = {key: self.get(name, key) for key in values}
        return out
