"""Regenerate docs/config.md's table of every config key from the config models:
``.venv/bin/python scripts/config_table.py``.

The table is the block of ``|`` lines that starts at the ``| key | default | ...`` header; it is replaced
by ``sao config --markdown`` (``sao.config.config_table()``), and nothing else in docs/config.md is touched.
``--check`` only reports whether it is up to date (exit 1 if not); ``tests/sao/test_readme.py`` checks the same.
"""
import sys
from pathlib import Path

from sao_harness.sao.config import config_table

CONFIG_DOC = Path(__file__).resolve().parent.parent / "docs" / "config.md"
HEADER = "| key | default |"


def table_in(text: str) -> str:
    """The key table of ``text``: the header line ``| key | default | ...`` and the ``|`` lines after it."""
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith(HEADER))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "".join(lines[start:end])


def main(argv: list[str]) -> int:
    text = CONFIG_DOC.read_text()
    old, new = table_in(text), config_table()
    if old == new:
        print("docs/config.md: config table up to date")
        return 0
    if "--check" in argv:
        print("docs/config.md: config table is stale; run .venv/bin/python scripts/config_table.py")
        return 1
    CONFIG_DOC.write_text(text.replace(old, new, 1))
    print(f"docs/config.md: config table regenerated ({new.count(chr(10)) - 2} keys)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
