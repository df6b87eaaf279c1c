"""`sao docker up|status|down|base` and `sao sandbox exec|shell|gc` (import-light registration).

Exit codes: 0 ok; 1 an infrastructure fault (engine, container), printed as one line; 2 bad input;
``sandbox exec`` returns the command's own exit code (124 when it timed out, 137 when OOM-killed).
"""
from __future__ import annotations

import argparse
import functools
import shlex
import shutil
import signal
import subprocess
import sys
import time

from sao_harness.core.errors import UserError
from sao_harness.envs.engine import (
    ProjectEngine,
    _use,
    docker_client,
    engine_status,
    ensure_engine,
    find_engine,
    stop_project_engine,
)
from sao_harness.envs.errors import CommandTimeout, ImageNotFound, OOMKilled, SandboxError
from sao_harness.envs.gc import gc, list_runs, run_scope


def _faults(func):
    """Print envs faults as one line (exit 1); a missing image is the user's input (exit 2)."""

    @functools.wraps(func)
    def wrapper(args):
        try:
            return func(args)
        except ImageNotFound as e:
            raise UserError(str(e)) from None
        except SandboxError as e:
            name = " ".join(x for x in (args.command, getattr(args, "action", None)) if x)
            print(f"sao {name}: {type(e).__name__}: {e}", file=sys.stderr)
            return 1

    return wrapper


# -- sao docker ---------------------------------------------------------------------------------
@_faults
def _docker_up(args) -> int:
    t0 = time.monotonic()
    client = ensure_engine(args.cfg.docker)
    v = client.version()
    print(f"docker: engine {v.get('Version')} (API {v.get('ApiVersion')}) answers at "
          f"{client.sao_docker_host} ({time.monotonic() - t0:.1f} s)")
    return 0


@_faults
def _docker_status(args) -> int:
    st = engine_status(args.cfg.docker)
    if st["url"] is None:
        print("docker: no engine answers")
        for reason in st["unreachable"]:
            print(f"  {reason}")
        print("  start one with: sao docker up")
        return 1
    kind = "project engine" if st["project_engine"] else "existing engine"
    print(f"docker: {kind} at {st['url']}")
    for key in ("server_version", "api_version", "storage_driver", "hard_disk_cap", "docker_root", "containers",
                "images", "networks", "project_pid", "state_dir"):
        if st.get(key) is not None:
            print(f"  {key}: {st[key]}")
    runs = list_runs(docker_client(args.cfg.docker))
    n = sum(len(r.containers) for r in runs.values())
    print(f"  sao-harness containers: {n} in {len(runs)} run(s)")
    return 0


@_faults
def _docker_down(args) -> int:
    if stop_project_engine(args.cfg.docker):
        print(f"docker: project engine stopped ({ProjectEngine(args.cfg.docker.state_dir).url})")
    else:
        print("docker: project engine not running")
    return 0


@_faults
def _docker_base(args) -> int:
    # lazy: keeps `sao --help` fast (the image stack)
    from sao_harness.envs.images import ensure_base_image

    client = ensure_engine(args.cfg.docker)
    print(ensure_base_image(client, args.cfg.docker))
    return 0


# -- sao sandbox --------------------------------------------------------------------------------
def _image(args, client) -> str:
    # lazy: keeps `sao --help` fast (the image stack)
    from sao_harness.envs.images import ensure_base_image, require_image

    if args.image:
        require_image(client, args.image)
        return args.image
    return ensure_base_image(client, args.cfg.docker)


def _command(argv: list[str]) -> str:
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise UserError("no command given (usage: sao sandbox exec [--image IMG] -- CMD...)")
    return argv[0] if len(argv) == 1 else shlex.join(argv)


@_faults
def _sandbox_exec(args) -> int:
    # lazy: keeps `sao --help` fast (the sandbox stack)
    from sao_harness.envs.sandbox import Sandbox

    command = _command(args.cmd)
    if args.timeout is not None and args.timeout <= 0:
        raise UserError(f"--timeout must be > 0 (got {args.timeout:g})")
    client = ensure_engine(args.cfg.docker)
    image = _image(args, client)
    with run_scope(), Sandbox(image, args.cfg.sandbox, client=client) as sb:
        try:
            res = sb.run(command, args.timeout)
        except CommandTimeout as e:
            sys.stdout.write(e.output)
            print(f"[timed out after {e.timeout_s:g} s; its processes were killed]", file=sys.stderr)
            return 124
        except OOMKilled as e:
            sys.stdout.write(e.output)
            print(f"[{e}]", file=sys.stderr)
            return 137
    sys.stdout.write(res.output)
    sys.stdout.flush()
    print(f"[exit code {res.exit_code}]", file=sys.stderr)
    return res.exit_code


@_faults
def _sandbox_shell(args) -> int:
    # lazy: keeps `sao --help` fast (the sandbox stack)
    from sao_harness.envs.sandbox import Sandbox

    if shutil.which("docker") is None:
        raise UserError("sandbox shell needs the `docker` CLI on PATH")
    client = ensure_engine(args.cfg.docker)
    image = _image(args, client)
    with run_scope(), Sandbox(image, args.cfg.sandbox, client=client) as sb:
        print(f"sandbox {sb.name} ({image}); network {sb.cfg.network}, memory {sb.cfg.memory}, "
              f"cpus {sb.cfg.cpus:g}, pids {sb.cfg.pids_limit}; removed on exit", file=sys.stderr)
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C belongs to the shell inside
        try:
            return subprocess.call(sb.exec_argv(tty=sys.stdin.isatty()), env=sb.docker_env())
        finally:
            signal.signal(signal.SIGINT, previous)


@_faults
def _sandbox_gc(args) -> int:
    url, _ = find_engine(args.cfg.docker)
    if url is None:
        print("gc: no Docker engine answers; nothing to collect")
        return 0
    rows = gc(_use(url), run_id=args.run_id, dry_run=args.dry_run)
    if not rows:
        print("gc: no sao-harness containers or volumes" + (f" for run {args.run_id}" if args.run_id else ""))
    for info, action in rows:
        print(f"gc: run {info.run_id}: {action}")
    return 0


def _config_option(p: argparse.ArgumentParser) -> None:
    """--config and --set key=value (instead of positional overrides, which would eat the command)."""
    p.add_argument("--config", metavar="FILE.yaml", default=None, help="run config")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="key.sub=value",
                   help="config override (repeatable), e.g. --set sandbox.memory=1g")
    p.set_defaults(takes_config=True)


def register(sub, add_config_args):
    d = sub.add_parser("docker", help="the Docker engine and the base image: up, status, down, base")
    dsub = d.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, func, text in (
        ("up", _docker_up, "use the engine that answers, or start the project's own dockerd (root)"),
        ("status", _docker_status, "which engine answers, and what it holds"),
        ("down", _docker_down, "stop the project's dockerd (not a system engine)"),
        ("base", _docker_base, "build (or find) the base image and print its tag"),
    ):
        p = dsub.add_parser(name, help=text, description=text)
        add_config_args(p)
        p.set_defaults(func=func)

    s = sub.add_parser("sandbox", help="hardened Docker sandboxes: exec, shell, gc")
    ssub = s.add_subparsers(dest="action", metavar="ACTION", required=True)
    e = ssub.add_parser("exec", help="run one command in a fresh hardened sandbox",
                        description="Run CMD in a fresh hardened sandbox; print its output; exit with its code. "
                                    "One argument is a shell string; several are quoted and joined.")
    e.add_argument("--image", default=None, help="image (default: the base image)")
    e.add_argument("--timeout", type=float, default=None, metavar="S", help="kill the command after S seconds")
    _config_option(e)
    e.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD...")
    e.set_defaults(func=_sandbox_exec)

    sh = ssub.add_parser("shell", help="interactive shell in a fresh hardened sandbox (removed after)")
    sh.add_argument("--image", default=None, help="image (default: the base image)")
    _config_option(sh)
    sh.set_defaults(func=_sandbox_shell)

    g = ssub.add_parser("gc", help="remove containers and volumes of runs that no longer exist",
                        description="Remove sao-harness containers and volumes (by label) of runs whose owning "
                                    "process is gone. Without --run-id: all dead runs (same as --all-dead).")
    g.add_argument("--run-id", default=None, help="only this run (still only if it is dead)")
    g.add_argument("--all-dead", action="store_true", help="every dead run (the default)")
    g.add_argument("--dry-run", action="store_true", help="list, remove nothing")
    add_config_args(g)
    g.set_defaults(func=_sandbox_gc)
