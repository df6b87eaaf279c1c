"""Command line interface: ``python -m semverkit <command> ...``.

Commands::

    sort [--reverse] VERSION...        print the versions in precedence order
    bump PART VERSION                  print the next major/minor/patch/prerelease
    satisfies RANGE VERSION...         print the versions in RANGE; exit 1 if none
    max RANGE VERSION...               print the highest version in RANGE
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence, TextIO

from . import __version__
from .spec import InvalidRange, Range
from .version import PARTS, InvalidVersion, Version


def _versions(texts: Sequence[str]) -> list[Version]:
    return [Version.parse(t) for t in texts]


def cmd_sort(args: argparse.Namespace, out: TextIO) -> int:
    for version in sorted(_versions(args.versions), reverse=args.reverse):
        print(version, file=out)
    return 0


def cmd_bump(args: argparse.Namespace, out: TextIO) -> int:
    print(Version.parse(args.version).bump(args.part, token=args.token), file=out)
    return 0


def cmd_satisfies(args: argparse.Namespace, out: TextIO) -> int:
    matching = Range(args.range).filter(args.versions)
    for version in matching:
        print(version, file=out)
    return 0 if matching else 1


def cmd_max(args: argparse.Namespace, out: TextIO) -> int:
    best = Range(args.range).max_satisfying(args.versions)
    if best is None:
        return 1
    print(best, file=out)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="semverkit", description="Semantic version tools.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("sort", help="sort versions by precedence")
    p.add_argument("--reverse", "-r", action="store_true", help="highest first")
    p.add_argument("versions", nargs="+")
    p.set_defaults(func=cmd_sort)

    p = sub.add_parser("bump", help="print the next version")
    p.add_argument("part", choices=PARTS)
    p.add_argument("version")
    p.add_argument("--token", default="rc", help="prerelease token (default: rc)")
    p.set_defaults(func=cmd_bump)

    p = sub.add_parser("satisfies", help="print the versions that satisfy a range")
    p.add_argument("range")
    p.add_argument("versions", nargs="+")
    p.set_defaults(func=cmd_satisfies)

    p = sub.add_parser("max", help="print the highest version that satisfies a range")
    p.add_argument("range")
    p.add_argument("versions", nargs="+")
    p.set_defaults(func=cmd_max)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None,
         err: TextIO | None = None) -> int:
    """Run the CLI; returns the exit status instead of exiting."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    args = build_parser().parse_args(argv)
    try:
        return args.func(args, out)
    except (InvalidVersion, InvalidRange) as exc:
        print(f"semverkit: error: {exc}", file=err)
        return 2
