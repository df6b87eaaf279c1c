"""What one process running N episodes at once needs of its host: open files and Docker connections.

``size_process(episodes, log=)``, at rollout start (``harness.rollout``):
- open files: the soft ``RLIMIT_NOFILE`` is raised to the hard limit when below ``fds_needed(episodes)``
  (``FDS_BASE + FDS_PER_EPISODE * episodes``); a hard limit below that too is logged, since episodes past it
  fail to open sockets (EMFILE). Descriptors >= 1024 are safe: the sandbox shell and terminal ``poll``
  (``envs.shell.wait_fd``), never ``select``;
- Docker connections: every client made after it keeps ``CONNECTIONS_PER_EPISODE * episodes`` connections
  (``envs.engine.ensure_pool``), since the grader's one client serves every episode's grading at once.
bench/bench_load.py measured ~17 descriptors per episode (sandbox shell and exec sockets, the terminal's PTY,
both ends of the proxy connection, grading) and ~60 for the process itself, at 16 episodes at once.
"""
from __future__ import annotations

import resource

from sao_harness.envs.engine import ensure_pool

FDS_BASE = 256  # the process itself (measured ~60), with room
FDS_PER_EPISODE = 32  # measured ~17, with room
CONNECTIONS_PER_EPISODE = 4  # at once on the grader's client: its clean run's two runs and gold probe, + 1


def fds_needed(episodes: int) -> int:
    return FDS_BASE + FDS_PER_EPISODE * episodes


def raise_open_files(episodes: int, log=print) -> int:
    """The soft limit of open files raised to the hard one when below ``fds_needed(episodes)``; the soft
    limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = fds_needed(episodes)
    if soft != resource.RLIM_INFINITY and soft < need:
        soft = hard if hard != resource.RLIM_INFINITY else need
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if soft != resource.RLIM_INFINITY and soft < need:
        log(f"warning: {episodes} episodes at once may need {need} open files, but this process may open at most "
            f"{soft} (ulimit -n; raise the hard limit, or run fewer rollout.workers)")
    return soft


def size_process(episodes: int, log=print) -> None:
    """Open files and Docker connection pools for ``episodes`` at once in this process (module doc)."""
    raise_open_files(episodes, log)
    ensure_pool(CONNECTIONS_PER_EPISODE * episodes)
