"""lint-imports on a checkout: the contracts of its pyproject.toml, the contracts section of the report.

    .venv/bin/python scripts/lint_imports.py [ROOT]

lint-imports runs in ROOT (its pyproject.toml; its working directory goes first on ``sys.path``), where
``sao_harness/`` reaches the product's folders through its symbolic links (``sao_harness/core -> ../core``,
...): the graph is ROOT's own, whatever copy the venv has installed. Exits with lint-imports' exit code.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """lint-imports' result for the checkout at ``root`` (its stdout and stderr captured)."""
    return subprocess.run([str(Path(sys.executable).with_name("lint-imports"))], cwd=root, capture_output=True,
                          text=True, timeout=300, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent).resolve()
    out = lint_imports(root)
    print(out.stdout.split("Contracts\n---------\n", 1)[-1].strip() or out.stdout, file=sys.stdout)
    if out.returncode:
        print(out.stderr[-3000:], file=sys.stderr)
    return out.returncode


if __name__ == "__main__":
    sys.exit(main())
