"""minicfg: a small, dependency-free INI-style configuration parser.

>>> import minicfg
>>> cfg = minicfg.loads('''
... [server]
... host = example.org
... port = 8080
... ''')
>>> cfg["server"]["host"]
'example.org'
>>> cfg.getint("server", "port")
8080
"""

from .config import DEFAULT_SECTION, Config, Section
from .errors import (
    ConfigError,
    DuplicateKeyError,
    InterpolationError,
    MissingKeyError,
    MissingSectionError,
    ParseError,
)
from .writer import dump, dumps

__version__ = "0.4.0"

__all__ = [
    "DEFAULT_SECTION",
    "Config",
    "ConfigError",
    "DuplicateKeyError",
    "InterpolationError",
    "MissingKeyError",
    "MissingSectionError",
    "ParseError",
    "Section",
    "dump",
    "dumps",
    "load",
    "loads",
]


def loads(text: str, **kwargs) -> Config:
    """Parse a string; keyword arguments go to :meth:`Config.loads`."""
    return Config.loads(text, **kwargs)


def load(path, **kwargs) -> Config:
    """Parse a file; keyword arguments go to :meth:`Config.load`."""
    return Config.load(path, **kwargs)
