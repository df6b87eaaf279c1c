"""`make test`: the suite as two pytest lanes at once, then the tests that need the machine alone.

The suite alone keeps two cores 73% busy: the Ray runs (trainer, `sao` end to end, injected faults) wait
on their actors and the Docker tests (sandboxes, grading) mostly on one Python thread driving the engine.
Run side by side, each fills the other's idle time:

- lane `ray`: the files in RAY_LANE, the tests that start Ray (so one Ray session is up at a time);
- lane `rest`: every other test;
- then `exclusive`: tests marked `exclusive` (they stop the Docker engine every sandbox runs on).

Lane `ray` streams its output; lane `rest` writes to a log that is printed when both have finished. Every
test runs exactly once: the lanes split the paths, the marker takes the exclusive tests out of both.
The last line is the whole run: its wall time and each part's pytest summary.

    python scripts/test_lanes.py [pytest options, e.g. --timeout=900 --durations=25]
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RAY_LANE = ["tests/sao/test_learn.py", "tests/sao/test_paper_run.py", "tests/trainer/test_train_loop.py",
            "tests/trainer/test_scale_out.py", "tests/trainer/test_learn_toy.py", "tests/trainer/test_train_swe.py",
            "tests/trainer/test_distributed.py", "tests/harness/test_faults.py", "tests/envs/test_images_pull.py"]
NOT_EXCLUSIVE = ["-m", "not exclusive"]
NO_TESTS = 5  # pytest's exit status when it selected no test
SUMMARY = re.compile(r"^\d+ (passed|failed|errors?|skipped|deselected)\b.* in [\d.]+s\b")


def pytest(args: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pytest", "-q", *args], cwd=ROOT, **kw)


def exclusive_files() -> list[str]:
    """The test files that mark a test `exclusive` (collecting only them saves the ~30 s a whole collection takes)."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                  if "mark.exclusive" in p.read_text())


def summary(text: str) -> str:
    """pytest's last line ("1 failed, 47 passed, 2 skipped, 3 warnings in 81.20s (0:01:21)"), without a '=' frame."""
    lines = [line.strip("= ") for line in text.splitlines() if SUMMARY.match(line.strip("= "))]
    return lines[-1] if lines else "no summary (see the output above)"


def clock(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def stream(proc: subprocess.Popen) -> tuple[str, int]:
    """Echo `proc`'s output as it comes (pytest's progress dots too); (all of it, its exit status)."""
    out = []
    while chunk := os.read(proc.stdout.fileno(), 65536):
        sys.stdout.write(chunk.decode(errors="replace"))
        sys.stdout.flush()
        out.append(chunk)
    return b"".join(out).decode(errors="replace"), proc.wait()


def main(argv: list[str]) -> int:
    t0 = time.monotonic()
    print(f"make test: lane ray ({', '.join(RAY_LANE)}) and lane rest (every other test) at once, "
          "then the exclusive tests", flush=True)
    with tempfile.NamedTemporaryFile("w+", prefix="sao-test-rest-", suffix=".log") as log:
        rest = pytest([*argv, *NOT_EXCLUSIVE, *[f"--ignore={p}" for p in RAY_LANE], "tests"], stdout=log,
                      stderr=subprocess.STDOUT)
        rest_done = []  # the lane's wall time, said as soon as it ends (lane ray's output is streaming)

        def wait_rest() -> None:
            rest.wait()
            rest_done.append(time.monotonic() - t0)
            print(f"\n[lane rest finished after {clock(rest_done[0])}; its output follows lane ray's]", flush=True)

        waiter = threading.Thread(target=wait_rest)
        waiter.start()
        ray_out, ray_rc = stream(pytest([*argv, *NOT_EXCLUSIVE, *RAY_LANE], stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT))
        waiter.join()
        log.seek(0)
        rest_out = log.read()
    lanes_s = time.monotonic() - t0
    print(f"\n--- lane rest (beside lane ray: {clock(rest_done[0])}) ---", flush=True)
    sys.stdout.write(rest_out)
    print("\n--- exclusive: the tests that stop the Docker engine, alone ---", flush=True)
    files = exclusive_files()
    ex_out, ex_rc = stream(pytest([*argv, "-m", "exclusive", *files], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT)) if files else ("", NO_TESTS)
    codes = {"ray": ray_rc, "rest": rest.returncode, "exclusive": 0 if ex_rc == NO_TESTS else ex_rc}
    failed = [name for name, rc in codes.items() if rc != 0]
    status = f"FAILED in {', '.join(failed)}" if failed else "passed"
    print(f"\nmake test: {status} in {clock(time.monotonic() - t0)} (lanes {clock(lanes_s)} at once, then "
          f"exclusive) | ray: {summary(ray_out)}; rest: {summary(rest_out)}; exclusive: {summary(ex_out)}",
          flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
