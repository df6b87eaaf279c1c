"""lint-imports on the checkout, seen as the installed package: the contracts of pyproject.toml.

    .venv/bin/python scripts/lint_imports.py [ROOT]

The product's folders (core/, envs/, ...) install as ``sao_harness.<folder>`` (setuptools package-dir),
which import-linter cannot follow in a checkout: this builds ``<tmp>/sao_harness/`` with a symbolic link
to each folder, runs ``lint-imports`` there with ROOT's pyproject.toml, and exits with its exit code.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

PACKAGES = ("core", "envs", "tasks", "harness", "trainer", "eval", "sao")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """lint-imports' result for the checkout at ``root`` (its stdout and stderr captured)."""
    with tempfile.TemporaryDirectory(prefix="sao-lint-imports-") as tmp:
        view = Path(tmp) / "sao_harness"
        view.mkdir()
        (view / "__init__.py").write_text((root / "sao_harness" / "__init__.py").read_text())
        for pkg in PACKAGES:
            (view / pkg).symlink_to(root / pkg, target_is_directory=True)
        return subprocess.run([str(Path(sys.executable).with_name("lint-imports")), str(root / "pyproject.toml")],
                              cwd=tmp, capture_output=True, text=True, timeout=300,
                              env={"PYTHONPATH": tmp, "PATH": os.environ.get("PATH", "/usr/bin:/bin")})


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent).resolve()
    out = lint_imports(root)
    print(out.stdout.split("Contracts\n---------\n", 1)[-1].strip() or out.stdout, file=sys.stdout)
    if out.returncode:
        print(out.stderr[-3000:], file=sys.stderr)
    return out.returncode


if __name__ == "__main__":
    sys.exit(main())
