"""Line-oriented parser for minicfg documents.

The syntax is deliberately close to classic INI files::

    # full-line comments start with '#' or ';'
    [server]
    host = example.org        ; inline comments need whitespace before them
    port: 8080
    motd = "Hello,\\tworld"   # double quotes understand escapes
    path = 'C:\\temp'         # single quotes are taken literally
    banner =
        first line
        second line           # indented lines continue the previous value

The parser knows nothing about types or interpolation: it produces
:class:`RawSection` objects holding string values, which
:class:`minicfg.config.Config` turns into something convenient to query.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .errors import DuplicateKeyError, ParseError

COMMENT_CHARS = "#;"
QUOTE_CHARS = "\"'"

_SECTION_RE = re.compile(r"^\[(?P<name>[^\[\]]*)\]$")
_ENTRY_RE = re.compile(r"^(?P<key>[A-Za-z0-9_.\-]+)\s*(?P<sep>[=:])\s*(?P<value>.*)$")

_ESCAPES = {
    "n": "\n",
    "t": "\t",
    "r": "\r",
    "0": "\0",
    "\\": "\\",
    '"': '"',
}


@dataclass
class Entry:
    """One ``key = value`` pair as it appeared in the source."""

    key: str
    value: str
    lineno: int
    quoted: bool = False


@dataclass
class RawSection:
    """A section and its entries, in source order."""

    name: str
    lineno: int
    entries: list[Entry] = field(default_factory=list)

    def as_dict(self) -> dict[str, str]:
        return {entry.key: entry.value for entry in self.entries}


def unescape(body: str, lineno: int = 0, source: str = "<string>") -> str:
    """Resolve backslash escapes inside a double-quoted string body."""
    out = []
    chars = iter(body)
    for ch in chars:
        if ch != "\\":
            out.append(ch)
            continue
        nxt = next(chars, None)
        if nxt is None:
            raise ParseError("dangling backslash at end of string", lineno, source)
        if nxt not in _ESCAPES:
            raise ParseError(f"unknown escape sequence \\{nxt}", lineno, source)
        out.append(_ESCAPES[nxt])
    return "".join(out)


def _find_closing_quote(text: str, quote: str) -> int:
    """Index of the quote closing the string that opens at ``text[0]``, or -1."""
    i = 1
    while i < len(text):
        ch = text[i]
        if ch == "\\" and quote == '"':
            i += 2
            continue
        if ch == quote:
            return i
        i += 1
    return -1


def _strip_inline_comment(text: str) -> str:
    """Remove a trailing comment, leaving comment characters inside quotes alone.

    A comment character only starts a comment at the beginning of the value or
    when preceded by whitespace, so ``color = #fff`` is a comment but
    ``url = http://host/#anchor`` is not.
    """
    quote = None
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\" and quote == '"':
                i += 2
                continue
            if ch == quote:
                quote = None
        elif ch == '"':
            quote = ch
        elif ch in COMMENT_CHARS and (i == 0 or text[i - 1].isspace()):
            return text[:i].rstrip()
        i += 1
    return text


def parse_value(text: str, lineno: int = 0, source: str = "<string>") -> tuple[str, bool]:
    """Turn the text after the separator into ``(value, quoted)``."""
    text = _strip_inline_comment(text).strip()
    if not text or text[0] not in QUOTE_CHARS:
        return text, False
    quote = text[0]
    end = _find_closing_quote(text, quote)
    if end == -1:
        raise ParseError("unterminated string", lineno, source)
    if text[end + 1 :].strip():
        raise ParseError("unexpected text after closing quote", lineno, source)
    body = text[1:end]
    if quote == '"':
        body = unescape(body, lineno, source)
    return body, True


def parse(text: str, *, source: str = "<string>", strict: bool = True) -> list[RawSection]:
    """Parse a document into its sections.

    Keys are case-insensitive and stored lower-cased; section names keep their
    case.  A section that appears twice is merged into its first occurrence.
    With ``strict`` (the default) a key repeated within a section is an error,
    otherwise the last value wins.
    """
    sections: list[RawSection] = []
    by_name: dict[str, RawSection] = {}
    current: RawSection | None = None
    last: Entry | None = None

    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped[0] in COMMENT_CHARS:
            if not stripped:
                last = None
            continue

        if line[0].isspace() and last is not None:
            if last.quoted:
                raise ParseError("cannot continue a quoted value", lineno, source)
            piece = _strip_inline_comment(stripped)
            last.value = f"{last.value}\n{piece}" if last.value else piece
            continue

        match = _SECTION_RE.match(stripped)
        if match:
            name = match.group("name").strip()
            if not name:
                raise ParseError("empty section name", lineno, source)
            current = by_name.get(name)
            if current is None:
                current = RawSection(name, lineno)
                by_name[name] = current
                sections.append(current)
            last = None
            continue

        match = _ENTRY_RE.match(stripped)
        if not match:
            raise ParseError(f"cannot parse line: {stripped!r}", lineno, source)
        if current is None:
            raise ParseError("key outside of any section", lineno, source)

        key = match.group("key").lower()
        value, quoted = parse_value(match.group("value"), lineno, source)
        existing = next((e for e in current.entries if e.key == key), None)
        if existing is not None:
            if strict:
                raise DuplicateKeyError(
                    f"duplicate key {key!r} in section {current.name!r}", lineno, source
                )
            current.entries.remove(existing)
        last = Entry(key, value, lineno, quoted)
        current.entries.append(last)

    return sections
