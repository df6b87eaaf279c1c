"""Exception types raised by minicfg."""

from __future__ import annotations


class ConfigError(Exception):
    """Base class for every error raised by minicfg."""


class ParseError(ConfigError):
    """The document is not valid minicfg syntax.

    ``lineno`` is 1-based and ``source`` names the file (or ``<string>``), so
    the message points at the offending line the way a compiler would.
    """

    def __init__(self, message: str, lineno: int, source: str = "<string>"):
        self.message = message
        self.lineno = lineno
        self.source = source
        super().__init__(f"{source}:{lineno}: {message}")


class DuplicateKeyError(ParseError):
    """A key appears twice in the same section while parsing in strict mode."""


class MissingSectionError(ConfigError, KeyError):
    """The requested section does not exist."""

    def __init__(self, section: str):
        self.section = section
        super().__init__(f"no section {section!r}")

    def __str__(self) -> str:  # KeyError would repr() the message otherwise
        return self.args[0]


class MissingKeyError(ConfigError, KeyError):
    """The requested key does not exist in the section (nor in DEFAULT)."""

    def __init__(self, section: str, key: str):
        self.section = section
        self.key = key
        super().__init__(f"no key {key!r} in section {section!r}")

    def __str__(self) -> str:
        return self.args[0]


class InterpolationError(ConfigError):
    """A ``${...}`` reference could not be resolved."""

    def __init__(self, message: str, section: str, key: str):
        self.section = section
        self.key = key
        super().__init__(f"[{section}] {key}: {message}")
