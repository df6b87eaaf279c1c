"""Read what a patch does to each file, the way ``git apply`` / ``patch -p1`` would see it.

``file_changes(text) -> list[FileChange]``: one entry per file block (``diff --git`` headers, or
plain ``---`` / ``+++`` unified diffs), with every path the block names (the ``diff --git`` line,
``---`` / ``+++``, ``rename from/to``, ``copy from/to``, ``Binary files ... differ``), decoded from
git's C quoting (``unquote_c``) and with the first component (``a/``, ``b/``) stripped; its modes
(``120000`` is a symlink), whether it is binary, and its hunks' lines. Unlike ``unidiff`` it keeps
going on anything it does not understand, so no encoding of a path hides it. Lines split where git
splits them (``split_lines``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}
_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@(.*)$")
SYMLINK_MODE = "120000"


def unquote_c(text: str) -> str:
    """git's C-quoted path (``"b/t\\303\\274.py"``: octal escapes of UTF-8 bytes, ``\\\\``, ``\\"``,
    ``\\t``, ``\\n``...) as text; an unquoted path is returned as is."""
    if len(text) < 2 or not (text.startswith('"') and text.endswith('"')):
        return text
    body, out, i = text[1:-1], bytearray(), 0
    while i < len(body):
        c = body[i]
        if c != "\\" or i + 1 == len(body):
            out += c.encode("utf-8")
            i += 1
            continue
        nxt = body[i + 1]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        elif re.match(r"[0-7]{3}", body[i + 1:i + 4]):
            out.append(int(body[i + 1:i + 4], 8) & 0xFF)
            i += 4
        else:
            out += nxt.encode("utf-8")
            i += 2
    return out.decode("utf-8", errors="replace")


def strip_prefix(path: str) -> str | None:
    """``a/x/y`` -> ``x/y`` (``-p1``); ``/dev/null`` -> None."""
    path = unquote_c(path.strip())
    if path in ("/dev/null", ""):
        return None
    return path.split("/", 1)[1] if "/" in path else path


def _name_field(rest: str) -> str:
    """The path of a ``---`` / ``+++`` line: a quoted name, or the text before a tab (timestamps)."""
    rest = rest.rstrip("\n")
    if rest.startswith('"'):
        m = re.match(r'"(?:[^"\\]|\\.)*"', rest)
        return m.group(0) if m else rest
    return rest.split("\t", 1)[0].rstrip()


def _git_header_paths(rest: str) -> list[str]:
    """Both names of ``diff --git <a> <b>`` (quoted or not; ``a/p b/p`` split where the halves match)."""
    tokens = re.findall(r'"(?:[^"\\]|\\.)*"|\S+', rest)
    if any(t.startswith('"') for t in tokens) and len(tokens) == 2:
        return tokens
    n = len(rest)
    if n % 2 == 1 and rest[n // 2] == " " and rest[: n // 2].split("/", 1)[-1] == rest[n // 2 + 1:].split("/", 1)[-1]:
        return [rest[: n // 2], rest[n // 2 + 1:]]
    i = rest.find(" b/")
    return [rest[:i], rest[i + 1:]] if i > 0 else tokens


def split_lines(text: str) -> list[str]:
    """``text``'s lines as ``git apply`` splits them: at ``\\n`` only (a CR before it dropped), never at
    the other breaks ``str.splitlines()`` honours (``\\f``, ``\\x1c``, ``\\u2028``...), which would
    let a header hide inside a line (the guard refuses patches that contain them)."""
    lines = [ln[:-1] if ln.endswith("\r") else ln for ln in (text or "").split("\n")]
    return lines[:-1] if lines and lines[-1] == "" else lines


@dataclass
class FileChange:
    """One file block of a patch (see the module doc)."""

    paths: list[str] = field(default_factory=list)  # every name the block gives, decoded, -p1
    old_path: str | None = None
    new_path: str | None = None
    modes: set[str] = field(default_factory=set)
    new_file: bool = False
    deleted: bool = False
    renamed_or_copied: bool = False
    binary: bool = False
    hunks: list[tuple[str, list[str]]] = field(default_factory=list)  # (section header, lines with +/-/space)

    def add_path(self, path: str | None, side: str = "") -> None:
        if path and path not in self.paths:
            self.paths.append(path)
        if path and side == "old":
            self.old_path = path
        elif path and side == "new":
            self.new_path = path

    @property
    def label(self) -> str:
        return self.new_path or self.old_path or (self.paths[-1] if self.paths else "?")

    @property
    def creates(self) -> bool:
        """True when the block makes a file appear at ``new_path`` (new file, rename or copy target)."""
        return self.new_file or self.renamed_or_copied or (self.old_path is None and self.new_path is not None)

    @property
    def symlink(self) -> bool:
        return SYMLINK_MODE in self.modes

    def added_lines(self) -> list[str]:
        return [ln[1:] for _, lines in self.hunks for ln in lines if ln.startswith("+")]


def file_changes(text: str) -> list[FileChange]:
    """Every file block of ``text`` (see the module doc)."""
    lines = split_lines(text)
    out: list[FileChange] = []
    cur: FileChange | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("diff --git "):
            cur = FileChange()
            out.append(cur)
            a_b = _git_header_paths(line[len("diff --git "):])
            if len(a_b) == 2:
                cur.add_path(strip_prefix(a_b[0]), "old")
                cur.add_path(strip_prefix(a_b[1]), "new")
        elif line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old = strip_prefix(_name_field(line[4:]))
            new = strip_prefix(_name_field(lines[i + 1][4:]))
            if cur is None or cur.hunks:  # a plain unified diff: a new block
                cur = FileChange()
                out.append(cur)
            cur.add_path(old, "old")
            cur.add_path(new, "new")
            if old is None:
                cur.new_file, cur.old_path = True, None
            if new is None:
                cur.deleted, cur.new_path = True, None
            i += 1
        elif cur is not None and (m := _HUNK.match(line)):
            n_old = int(m.group(1)) if m.group(1) is not None else 1
            n_new = int(m.group(2)) if m.group(2) is not None else 1
            body: list[str] = []
            i += 1
            while i < len(lines) and (n_old > 0 or n_new > 0 or lines[i].startswith("\\")):
                ln = lines[i]
                if ln.startswith("\\"):
                    pass
                elif ln.startswith("+"):
                    n_new -= 1
                elif ln.startswith("-"):
                    n_old -= 1
                elif ln.startswith(" ") or ln == "":
                    n_old, n_new = n_old - 1, n_new - 1
                else:
                    break
                body.append(ln)
                i += 1
            cur.hunks.append((m.group(3).strip(), body))
            continue
        elif cur is not None:
            _header_line(cur, line)
        i += 1
    return out


def _header_line(cur: FileChange, line: str) -> None:
    for key, side in (("rename from ", "old"), ("rename to ", "new"), ("copy from ", "old"), ("copy to ", "new")):
        if line.startswith(key):
            cur.add_path(unquote_c(line[len(key):].strip()) or None, side)
            cur.renamed_or_copied = True
            return
    if line.startswith(("new file mode ", "deleted file mode ", "old mode ", "new mode ")):
        cur.modes.add(line.split()[-1])
        cur.new_file = cur.new_file or line.startswith("new file")
        cur.deleted = cur.deleted or line.startswith("deleted file")
    elif line.startswith("GIT binary patch"):
        cur.binary = True
    elif line.startswith("Binary files ") and line.endswith(" differ"):
        cur.binary = True
        m = re.match(r'Binary files ("(?:[^"\\]|\\.)*"|\S+) and ("(?:[^"\\]|\\.)*"|\S+) differ', line)
        if m:
            cur.add_path(strip_prefix(m.group(1)))
            cur.add_path(strip_prefix(m.group(2)))
