"""Sandbox benchmarks: per-command latency, container start/stop, 32 concurrent sandboxes.

Run: ``.venv/bin/python bench/bench_sandbox.py [--concurrent 32] [--commands 20] [--n 100]``.
Prints figures and a PASS/FAIL verdict per target:
- persistent-shell command overhead under 5 ms (median of ``--n`` runs of the builtin ``true``),
- ``--concurrent`` sandboxes held at once, each running ``--commands`` commands, without errors.
For comparison: ``exec_run`` per command and a local ``subprocess.run``.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from _common import verdict


def _ms(values: list[float]) -> str:
    values = sorted(values)
    p90 = values[int(len(values) * 0.9) - 1] if len(values) >= 10 else values[-1]
    return f"median {statistics.median(values) * 1000:8.2f} ms   p90 {p90 * 1000:8.2f} ms   (n={len(values)})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100, help="commands per latency figure")
    ap.add_argument("--concurrent", type=int, default=32)
    ap.add_argument("--commands", type=int, default=20)
    ap.add_argument("--starts", type=int, default=10)
    args = ap.parse_args()

    from sao_harness.envs.config import DockerConfig, SandboxConfig
    from sao_harness.envs.engine import ensure_engine
    from sao_harness.envs.gc import run_scope
    from sao_harness.envs.images import ensure_base_image
    from sao_harness.envs.sandbox import Sandbox

    client = ensure_engine(DockerConfig())
    image = ensure_base_image(client, DockerConfig())
    cfg = SandboxConfig(memory="256m", pids_limit=256)
    verdicts: list[tuple[str, bool, str]] = []
    print(f"engine {client.version()['Version']} at {client.sao_docker_host}; image {image}")

    with run_scope() as run_id:
        print(f"\n== per-command latency ({args.n} commands each)")
        with Sandbox(image, cfg, client=client, run_id=run_id) as sb:
            for _ in range(10):
                sb.run("true")
            shell = [sb.run("true").duration_s for _ in range(args.n)]
            ext = [sb.run("/bin/true").duration_s for _ in range(args.n)]
            execs = []
            for _ in range(args.n):
                t0 = time.perf_counter()
                sb.container.exec_run(["true"])
                execs.append(time.perf_counter() - t0)
        local = []
        for _ in range(args.n):
            t0 = time.perf_counter()
            subprocess.run(["true"])
            local.append(time.perf_counter() - t0)
        print(f"persistent shell, builtin `true`   {_ms(shell)}")
        print(f"persistent shell, `/bin/true`      {_ms(ext)}")
        print(f"exec_run(['true'])                 {_ms(execs)}")
        print(f"local subprocess.run(['true'])     {_ms(local)}")
        med = statistics.median(shell) * 1000
        verdicts.append(("persistent-shell overhead < 5 ms median", med < 5, f"{med:.2f} ms"))

        print(f"\n== container start + stop ({args.starts} sandboxes, one after another)")
        starts, stops = [], []
        for _ in range(args.starts):
            t0 = time.perf_counter()
            sb = Sandbox(image, cfg, client=client, run_id=run_id)
            t1 = time.perf_counter()
            sb.close()
            starts.append(t1 - t0)
            stops.append(time.perf_counter() - t1)
        print(f"create + start + shell ready       {_ms(starts)}")
        print(f"remove (force)                     {_ms(stops)}")

        n = args.concurrent
        print(f"\n== {n} concurrent sandboxes x {args.commands} commands")
        errors: list[str] = []
        held: list = []

        def one(i: int) -> float:
            t0 = time.perf_counter()
            try:
                sb = Sandbox(image, cfg, client=client, run_id=run_id)
                held.append(sb)
                for j in range(args.commands):
                    r = sb.run(f"echo {i}-{j} && ls / | wc -l")
                    if r.exit_code != 0 or not r.output.startswith(f"{i}-{j}\n"):
                        errors.append(f"sandbox {i} command {j}: exit {r.exit_code}: {r.output[:100]!r}")
            except Exception as e:  # counted, reported below
                errors.append(f"sandbox {i}: {type(e).__name__}: {e}")
            return time.perf_counter() - t0

        t0 = time.perf_counter()
        with ThreadPoolExecutor(n) as pool:
            per = list(pool.map(one, range(n)))
        wall = time.perf_counter() - t0
        alive = sum(1 for sb in held if sb.state().get("Running"))
        t1 = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda sb: sb.close(), held))
        close = time.perf_counter() - t1
        print(f"wall time {wall:.1f} s for {n * args.commands} commands; per sandbox {_ms(per)}")
        print(f"running at the end: {alive}/{n}; removing all took {close:.1f} s; errors: {len(errors)}")
        for e in errors[:5]:
            print(f"  {e}")
        verdicts.append((f"{n} concurrent sandboxes x {args.commands} commands without errors",
                         not errors and alive == n, f"{len(errors)} errors, {alive}/{n} held, {wall:.1f} s"))

    print("\n== targets")
    for name, ok, figure in verdicts:
        print(f"{verdict(ok)}  {name}: {figure}")
    return 0 if all(ok for _, ok, _ in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
