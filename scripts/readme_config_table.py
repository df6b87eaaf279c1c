"""Regenerate README.md's config key table from the config models: ``.venv/bin/python scripts/readme_config_table.py``.

The table is the block of ``|`` lines that starts at the ``| key | default | ...`` header; it is replaced
by ``sao config --markdown`` (``sao.config.config_table()``), and nothing else in README.md is touched.
``--check`` only reports whether the README is up to date (exit 1 if not).
"""
import sys
from pathlib import Path

from sao.config import config_table

README = Path(__file__).resolve().parent.parent / "README.md"


def table_in(text: str) -> str:
    """The README's key table: the header line ``| key | default | ...`` and the ``|`` lines after it."""
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith("| key | default |"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "".join(lines[start:end])


def main(argv: list[str]) -> int:
    text = README.read_text()
    old, new = table_in(text), config_table()
    if old == new:
        print("README.md: config table up to date")
        return 0
    if "--check" in argv:
        print("README.md: config table is stale; run .venv/bin/python scripts/readme_config_table.py")
        return 1
    README.write_text(text.replace(old, new, 1))
    print(f"README.md: config table regenerated ({new.count(chr(10)) - 2} keys)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
