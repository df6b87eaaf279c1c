"""The Debian mirror (and its keyring) that the host's apt already uses.

Reads ``/etc/apt/sources.list`` and ``/etc/apt/sources.list.d/*.list|*.sources`` (one-line and
deb822 formats) and returns the first ``deb`` source that serves ``suite`` with component ``main``.
Reusing the host's mirror keeps the host's proxy / TLS setup working for debootstrap.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")


@dataclass(frozen=True)
class Source:
    uri: str
    suites: tuple[str, ...]
    components: tuple[str, ...]
    signed_by: str | None = None


def _one_line(text: str) -> list[Source]:
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line.startswith("deb "):
            continue
        words = line.split()[1:]
        signed = None
        if words and words[0].startswith("["):
            opts = []
            while words:
                w = words.pop(0)
                opts.append(w.strip("[]"))
                if w.endswith("]"):
                    break
            for o in opts:
                if o.startswith("signed-by="):
                    signed = o.split("=", 1)[1]
        if len(words) >= 2:
            out.append(Source(words[0], (words[1],), tuple(words[2:]), signed))
    return out


def _deb822(text: str) -> list[Source]:
    out = []
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = None
        for line in stanza.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            if line[0] in " \t" and key:
                fields[key] += " " + line.strip()
                continue
            key, _, value = line.partition(":")
            key = key.strip().lower()
            fields[key] = value.strip()
        if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes").lower() == "no":
            continue
        for uri in fields.get("uris", "").split():
            out.append(Source(uri, tuple(fields.get("suites", "").split()),
                              tuple(fields.get("components", "").split()), fields.get("signed-by")))
    return out


def host_sources(root: Path = Path("/etc/apt")) -> list[Source]:
    files = [root / "sources.list"] if (root / "sources.list").is_file() else []
    d = root / "sources.list.d"
    if d.is_dir():
        files += sorted(p for p in d.iterdir() if p.suffix in (".list", ".sources"))
    out: list[Source] = []
    for f in files:
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        out += _deb822(text) if f.suffix == ".sources" else _one_line(text)
    return out


def debian_mirror(suite: str, override: str | None = None) -> tuple[str, Path | None]:
    """(mirror URI, keyring file or None) for debootstrapping ``suite``."""
    keyring = DEFAULT_KEYRING if DEFAULT_KEYRING.is_file() else None
    if override:
        return override, keyring
    for src in host_sources():
        if suite in src.suites and "main" in src.components and src.uri.startswith(("http://", "https://")):
            signed = Path(src.signed_by) if src.signed_by and src.signed_by.startswith("/") else None
            return src.uri.rstrip("/"), signed if signed and signed.is_file() else keyring
    return DEFAULT_MIRROR, keyring
