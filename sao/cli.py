"""`sao`: the one command line of sao-harness.

Every area registers its own subcommands (``envs.cli``, ``tasks.cli``, ``harness.cli``,
``trainer.cli``, ``eval.cli``, ``sao.serve``; ``sao config``, ``sao demo``, ``sao learn``, ``sao paper`` and
``sao doctor`` are here);
registration is import-light, heavy imports happen in handlers.
A command that takes a config gets ``--config FILE`` and dotted overrides (``trainer.lr=1e-6``);
the config is validated before any work, and a bad one is a one-line error with exit code 2.
"""
from __future__ import annotations

import argparse
import gc
import importlib
import logging
import os
import sys

from sao_harness.core.config import ConfigError
from sao_harness.core.errors import UserError
from sao_harness.harness.config import context_budget
from sao_harness.harness.runner import env_spec
from sao_harness.sao.config import config_table, dump_config, load_config
from sao_harness.trainer.gpu_plan import plan as gpu_plan

AREAS = tuple(f"sao_harness.{m}" for m in (
    "envs.cli", "tasks.cli", "harness.cli", "trainer.cli", "eval.cli", "sao.serve"))

DEFAULT_CONFIG = "configs/local.yaml"


def add_config_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Give a command ``--config FILE`` and ``key.sub=value`` overrides; ``args.cfg`` is then set."""
    parser.add_argument("--config", metavar="FILE.yaml", default=None,
                        help=f"run config (default: {DEFAULT_CONFIG} when present, else built-in defaults)")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")
    parser.set_defaults(takes_config=True)
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sao",
                                     description="sao-harness: SAO reinforcement learning for coding agents")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for area in AREAS:
        importlib.import_module(area).register(sub, add_config_args)
    p = sub.add_parser("config", help="print the validated config (--markdown: the table of every key)")
    p.add_argument("--markdown", action="store_true",
                   help="print docs/config.md's table of every key with its built-in default and description")
    add_config_args(p)
    p.set_defaults(func=cmd_config)
    p = sub.add_parser("demo", help="an agent getting better in ~10 minutes: the learning test-bed, then expert "
                                    "traces -> SFT -> SAO -> eval on bundled tasks (make demo: configs/demo.yaml)")
    add_config_args(p)
    p.set_defaults(func=cmd_demo)
    p = sub.add_parser("learn", help="the learning demo: expert traces, SFT warm start, then SAO vs GRPO+DIS vs GRPO "
                                     "for the same wall time, each evaluated (default config: configs/learn.yaml)")
    add_config_args(p)
    p.set_defaults(func=cmd_learn)
    p = sub.add_parser("paper", help="the paper's claims as experiments on the long-horizon test-bed, with seeds "
                                     "and 95%% intervals (make paper: configs/paper.yaml)")
    p.add_argument("--quick", action="store_true", help="the same experiments with paper.quick_steps and "
                   "paper.quick_seeds (under 25 minutes on 2 cores)")
    p.add_argument("--resume", metavar="DIR", default=None, help="continue the `sao paper` run in DIR: only its "
                   "unfinished runs run (its own paper.yaml; --config and overrides are ignored)")
    p.add_argument("--sweep", action="store_true", help="instead: the SAO arm at each of paper.lr_sweep, to "
                   "choose paper.lr")
    add_config_args(p)
    p.set_defaults(func=cmd_paper)
    p = sub.add_parser("doctor", help="check what a run needs, one line each: ok, or what is wrong and the fix "
                                      "(installs nothing; exit 1 when a check fails)")
    add_config_args(p)
    p.set_defaults(func=cmd_doctor)
    return parser


def cmd_config(args) -> int:
    """The validated config as YAML, then as YAML comments whether the model's chat template serves
    ``proxy.tool_format`` and the context budget in force (the output stays a config file); a template
    that cannot serve it is a one-line error (exit 2) before anything is printed; with --markdown, the
    key table of the built-in defaults (docs/config.md)."""
    if args.markdown:
        print(config_table(), end="")
        return 0
    from sao_harness.harness.proxy.tool_support import model_tool_support  # lazy: transformers

    tools = model_tool_support(args.cfg.model, args.cfg.proxy, local_only=True)  # builds, downloads nothing
    if not tools.ok:
        raise UserError(tools.message())
    print(dump_config(args.cfg), end="")
    print(f"# tools: {tools.detail}")
    print(f"# {context_budget(args.cfg).describe()}")
    plan = gpu_plan(args.cfg)  # None without cluster.nodes; it fits (checked when the config loaded)
    for line in plan.describe() if plan else []:
        print(f"# {line}")
    return 0


def cmd_demo(args) -> int:
    from sao_harness.sao.demo import run_demo  # lazy: the demo pulls in every stage

    return run_demo(args.cfg)


def cmd_learn(args) -> int:
    from sao_harness.sao.learn import run_learn  # lazy: the learning demo pulls in every stage

    return run_learn(args.cfg)


def cmd_paper(args) -> int:
    from sao_harness.sao.paper import run_paper, run_sweep  # lazy: the runs and the report

    def log(line: str) -> None:  # progress as it happens, also through a pipe
        print(line, flush=True)

    if args.sweep:
        return run_sweep(args.cfg, log=log)
    return run_paper(args.cfg, quick=args.quick, resume=args.resume, log=log)


def cmd_doctor(args) -> int:
    from sao_harness.sao.doctor import doctor  # lazy: the checks import docker-py, torch and ray

    label = args.config or (DEFAULT_CONFIG if os.path.exists(DEFAULT_CONFIG) else "built-in defaults")
    return doctor(args.cfg, label)


def load_args_config(args: argparse.Namespace):
    """The config of ``--config`` (or the default file) with the overrides; overrides that an ``--only ID...``
    option swallowed (``late_overrides``) count too."""
    args.overrides = list(args.overrides or []) + list(getattr(args, "late_overrides", None) or [])
    args.late_overrides = []
    path = args.config
    if path is None and os.path.exists(DEFAULT_CONFIG):
        path = DEFAULT_CONFIG
    return load_config(path, args.overrides)


def tools_preflight(args) -> None:
    """Before any episode, image or engine of ``sao rollout``, ``sao train`` (an env with ``preflight``: swe) and
    ``sao eval`` (the agent eval): the policy's chat template can serve ``proxy.tool_format``; else a one-line
    ``UserError`` with the fix (``harness.proxy.tool_support``). Other commands: nothing."""
    cfg, cmd = args.cfg, args.command
    agent_eval = cmd == "eval" and getattr(args, "eval_command", None) is None
    if not (cmd == "rollout" or (cmd == "train" and env_spec(cfg.trainer.env).preflight) or agent_eval):
        return
    from sao_harness.harness.proxy.tool_support import require_tool_support  # lazy: transformers

    model_path = None
    checkpoint = (getattr(args, "checkpoint", None) or cfg.eval.checkpoint) if agent_eval else None
    if checkpoint:
        from sao_harness.eval.policy import resolve_policy  # lazy: the checkpoint rules of `sao eval`

        eval_cfg = cfg.model_copy(deep=True)
        eval_cfg.eval.checkpoint = checkpoint
        try:
            model_path = resolve_policy(eval_cfg).model_path
        except UserError:
            return  # `sao eval` itself names the bad checkpoint
    require_tool_support(cfg.model, cfg.proxy, model_path)


def replay_preflight(args) -> None:
    """``sao train`` with ``trainer.router_replay=on``: the engine records the routes replay needs, else a
    one-line ``UserError`` before Ray or any engine starts (``harness.engines.routes.engine_routes``)."""
    cfg = args.cfg
    if args.command != "train" or cfg.trainer.router_replay != "on":
        return
    from sao_harness.harness.engines.routes import engine_routes  # lazy: imports torch for vllm's check
    from sao_harness.harness.tiny_model import resolve_model_path  # lazy: builds the tiny model if asked

    why = engine_routes(cfg, resolve_model_path(cfg.model), env_spec(cfg.trainer.env).stand_in_name(cfg))
    if why is not None:
        raise UserError(f"trainer.router_replay=on, but the engine records no routed experts: {why}; use "
                        "trainer.router_replay=auto (replay the traces that carry routes) or off")


def _quiet_torch() -> None:
    """The OpenHands SDK raises logging to INFO; torch then prints cache statistics at exit."""
    for name in ["torch", *[n for n in logging.root.manager.loggerDict if n.startswith("torch.")]]:
        logging.getLogger(name).setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.cfg = load_args_config(args) if getattr(args, "takes_config", False) else None
    except ConfigError as e:
        print(f"sao {args.command}: {e}", file=sys.stderr)
        return 2
    try:
        if args.cfg is not None:
            tools_preflight(args)
            replay_preflight(args)
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


def run() -> None:
    """The `sao` command: `main()`, then exit. `gc.freeze()` first: the interpreter's last collections at exit
    then skip every object alive, about 2 s less CPU for a process that imported torch and the OpenHands SDK
    (the modules are still torn down and every exit handler runs)."""
    rc = main()
    gc.freeze()
    sys.exit(rc)


if __name__ == "__main__":
    run()
