"""minicfg: a small, dependency-free INI-style configuration parser."""

from .errors import ConfigError, DuplicateKeyError, ParseError
from .parser import parse

__version__ = "0.1.0"

__all__ = ["ConfigError", "DuplicateKeyError", "ParseError", "parse"]
