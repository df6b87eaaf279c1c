"""Serialising a :class:`~minicfg.config.Config` back to text.

The output is meant to round-trip: ``Config.loads(dumps(cfg))`` gives back
the same raw values.  Values that the parser would otherwise read
differently are written in double quotes.
"""

from __future__ import annotations

import io
from typing import TextIO

from .config import DEFAULT_SECTION, Config
from .parser import COMMENT_CHARS, QUOTE_CHARS


def _needs_quotes(value: str) -> bool:
    if value == "":
        return False
    if value != value.strip():
        return True
    return value[0] in QUOTE_CHARS or value[0] in COMMENT_CHARS


def format_value(value: str) -> str:
    """The text to write after ``key = `` for ``value``."""
    if "\n" in value:
        # multi-line values are written as continuation lines
        lines = value.split("\n")
        return "\n".join([lines[0]] + [f"    {line}" for line in lines[1:]])
    if _needs_quotes(value):
        return f'"{value}"'
    return value


def dump(config: Config, fh: TextIO, *, raw: bool = True) -> None:
    """Write ``config`` to an open text file.

    ``DEFAULT`` comes first when it has values; sections follow in insertion
    order, separated by blank lines.  With ``raw`` (the default) references
    are written as they are, otherwise their expanded values are written.
    """
    data = config.to_dict(raw=raw)
    names = [DEFAULT_SECTION] if DEFAULT_SECTION in data else []
    names += [name for name in data if name != DEFAULT_SECTION]
    for index, name in enumerate(names):
        if index:
            fh.write("\n")
        fh.write(f"[{name}]\n")
        for key, value in data[name].items():
            fh.write(f"{key} = {format_value(value)}\n")


def dumps(config: Config, *, raw: bool = True) -> str:
    """Like :func:`dump`, returning a string."""
    buf = io.StringIO()
    dump(config, buf, raw=raw)
    return buf.getvalue()
