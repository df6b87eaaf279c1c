"""Install Debian packages on the host when a needed program is missing (root only).

``ensure_programs({"dockerd": "docker.io"})`` installs ``docker.io`` unless ``dockerd`` is on PATH.
``apt-get update`` runs at most once per process. Package maintainer scripts are kept from starting
services (a temporary ``policy-rc.d``): the Debian ``docker.io`` package would otherwise start a
stock dockerd with a private-range ``docker0`` bridge.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from sao_harness.envs.errors import EngineError

_SBIN = ("/usr/sbin", "/sbin", "/usr/local/sbin")
_POLICY = Path("/usr/sbin/policy-rc.d")
_updated = False


def which(program: str) -> str | None:
    """``shutil.which`` that also looks in the sbin directories (not on a user's PATH)."""
    path = os.environ.get("PATH", "") + os.pathsep + os.pathsep.join(_SBIN)
    return shutil.which(program, path=path)


def _apt(args: list[str]) -> None:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    proc = subprocess.run(["apt-get", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, errors="replace")
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.strip().splitlines()[-15:])
        raise EngineError(f"`apt-get {' '.join(args)}` failed (exit {proc.returncode}):\n{tail}")


def ensure_programs(programs: dict[str, str], *, log=None) -> None:
    """Install the Debian package of every program (name -> package) not found on PATH."""
    global _updated
    missing = sorted({pkg for prog, pkg in programs.items() if which(prog) is None})
    if not missing:
        return
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    if os.geteuid() != 0:
        raise EngineError(f"missing {', '.join(programs)}: install the Debian package(s) "
                          f"{' '.join(missing)} (as root: apt-get install -y {' '.join(missing)})")
    if shutil.which("apt-get") is None:
        raise EngineError(f"missing {', '.join(missing)} and no apt-get on this machine: install them by hand")
    placed_policy = False
    if not _POLICY.exists():
        _POLICY.write_text("#!/bin/sh\n# sao-harness: no service starts during package installs\nexit 101\n")
        _POLICY.chmod(0o755)
        placed_policy = True
    try:
        if not _updated:
            log("host: apt-get update")
            _apt(["update"])
            _updated = True
        log(f"host: apt-get install -y {' '.join(missing)}")
        _apt(["install", "-y", "--no-install-recommends", *missing])
    finally:
        if placed_policy:
            _POLICY.unlink(missing_ok=True)
    still = [prog for prog in programs if which(prog) is None]
    if still:
        raise EngineError(f"installed {' '.join(missing)} but still missing: {', '.join(still)}")
