"""`sao`: the one command line of sao-harness.

Every area registers its own subcommands (``harness.commands``, ``envs.cli``, ``tasks.cli``,
``eval.cli``, ``trainer.cli``); registration is import-light, heavy imports happen in handlers.
A command that takes a config gets ``--config FILE`` and dotted overrides (``trainer.lr=1e-6``);
the config is validated before any work, and a bad one is a one-line error with exit code 2.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from harness.errors import UserError

AREAS = ("harness.commands", "harness.serve", "envs.cli", "tasks.cli", "eval.cli", "trainer.cli")

DEFAULT_CONFIG = "configs/local.yaml"


def add_config_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Give a command ``--config FILE`` and ``key.sub=value`` overrides; ``args.cfg`` is then set."""
    parser.add_argument("--config", metavar="FILE.yaml", default=None,
                        help=f"run config (default: {DEFAULT_CONFIG} when present, else built-in defaults)")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")
    parser.set_defaults(takes_config=True)
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sao", description="sao-harness: SAO reinforcement learning for coding agents")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for area in AREAS:
        importlib.import_module(area).register(sub, add_config_args)
    return parser


def _load(args: argparse.Namespace):
    from harness.config import load_config

    path = args.config
    if path is None and os.path.exists(DEFAULT_CONFIG):
        path = DEFAULT_CONFIG
    return load_config(path, args.overrides)


def _quiet_torch() -> None:
    """The OpenHands SDK raises logging to INFO; torch then prints cache statistics at exit."""
    import logging

    for name in ["torch", *[n for n in logging.root.manager.loggerDict if n.startswith("torch.")]]:
        logging.getLogger(name).setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    parser = build_parser()
    args = parser.parse_args(argv)
    from harness.config import ConfigError

    try:
        args.cfg = _load(args) if getattr(args, "takes_config", False) else None
    except ConfigError as e:
        print(f"sao {args.command}: {e}", file=sys.stderr)
        return 2
    try:
        rc = args.func(args)
    except (UserError, ConfigError) as e:
        print(f"sao {args.command}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"sao {args.command}: interrupted", file=sys.stderr)
        return 130
    finally:
        _quiet_torch()
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
