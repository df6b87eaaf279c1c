"""`make test`: the suite as pytest jobs, two at a time, so that both cores stay busy to the end.

The suite is CPU-bound: about 2,800 s of tests on two cores. It is split into jobs by path and marker, and
every test runs in exactly one job (tests/core/test_lanes.py checks the split):

- `ray docker`: the tests of RAY_LANE (the files that start Ray) that use the Docker engine;
- `docker`: every other test that uses the Docker engine;
- `plain`, `ray plain 1..3`: the tests that use no Docker engine: RAY_GROUPS (the long Ray files) in three
  jobs, everything else in `plain`;
- `exclusive`: the tests that restart the Docker engine (they kill every sandbox of the machine), alone
  after every other job (beside the Docker-free jobs, a resumed run met the restarted engine failing).

Two jobs run at a time, the Docker ones first, then the others in the order of `jobs()` (the longest first,
as measured); a job starts as soon as a core is free. The Docker-free jobs are all CPU-bound, so each of
their processes has one OpenMP thread (OMP_NUM_THREADS=1, unless set already): two threads in each spin
against the other job's, and their torch tests took 80% more CPU. The Docker jobs keep torch's threads:
the `docker` job waits on sandboxes half its time, and the trainer beside it uses the idle core
(docs/results/2026-12-07-test-budget.md). Each job's output is printed when it ends. The last line is the
whole run: its wall time and each job's pytest summary.

    python scripts/test_lanes.py [pytest options, e.g. --timeout=900 --durations=15]
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RAY_LANE = ["tests/sao/test_learn.py", "tests/sao/test_paper_run.py", "tests/trainer/test_train_loop.py",
            "tests/trainer/test_scale_out.py", "tests/trainer/test_learn_toy.py", "tests/trainer/test_train_swe.py",
            "tests/trainer/test_distributed.py", "tests/harness/test_faults.py", "tests/envs/test_images_pull.py"]
RAY_GROUPS = [["tests/sao/test_paper_run.py", "tests/trainer/test_learn_toy.py"],  # ~370 s
              ["tests/trainer/test_train_loop.py", "tests/trainer/test_scale_out.py"],  # ~310 s
              ["tests/trainer/test_distributed.py"]]  # ~95 s
DOCKER, PLAIN, EXCLUSIVE = "docker and not exclusive", "not docker and not exclusive", "exclusive"
SLOTS = 2  # jobs at a time: the machine's two cores
NO_TESTS = 5  # pytest's exit status when it selected no test
SUMMARY = re.compile(r"^\d+ (passed|failed|errors?|skipped|deselected)\b.* in [\d.]+s\b")


@dataclass
class Job:
    """One pytest run: `paths` (None: all of tests/ but `ignore`) and the tests of them that `marker` selects."""

    name: str
    marker: str
    paths: list[str] | None = None
    ignore: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    log: object = None
    started: float = 0.0
    ended: float | None = None

    def args(self) -> list[str]:
        return ["-m", self.marker, *(self.paths or [f"--ignore={p}" for p in self.ignore] + ["tests"])]

    def files(self, all_files: list[str]) -> list[str]:
        """The test files this job collects, of `all_files` (paths relative to the checkout)."""
        return [f for f in all_files if (f in self.paths if self.paths else f not in self.ignore)]


def jobs() -> list[Job]:
    """The jobs, in the order they start (`exclusive` last: it waits for all the others)."""
    grouped = [p for group in RAY_GROUPS for p in group]
    return [Job("ray docker", DOCKER, paths=RAY_LANE), Job("docker", DOCKER, ignore=RAY_LANE),
            Job("plain", PLAIN, ignore=grouped),
            *[Job(f"ray plain {i}", PLAIN, paths=group) for i, group in enumerate(RAY_GROUPS, 1)],
            Job("exclusive", EXCLUSIVE, paths=exclusive_files())]


def test_files() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py"))


def exclusive_files() -> list[str]:
    """The test files that mark a test `exclusive` (collecting only them saves the ~30 s a whole collection takes)."""
    return [f for f in test_files() if "mark.exclusive" in (ROOT / f).read_text()]


def summary(text: str) -> str:
    """pytest's last line ("1 failed, 47 passed, 2 skipped, 3 warnings in 81.20s (0:01:21)"), without a '=' frame."""
    lines = [line.strip("= ") for line in text.splitlines() if SUMMARY.match(line.strip("= "))]
    return lines[-1] if lines else "no summary (see its output above)"


def clock(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def main(argv: list[str]) -> int:
    t0 = time.monotonic()
    queue = jobs()
    one_thread = {"OMP_NUM_THREADS": "1", **os.environ}
    print(f"make test: {len(queue)} pytest jobs, {SLOTS} at a time ({', '.join(j.name for j in queue[:-1])}), "
          "then `exclusive` alone", flush=True)

    def start(job: Job) -> None:
        job.log = tempfile.TemporaryFile("w+")
        job.proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", *argv, *job.args()], cwd=ROOT,
                                    stdout=job.log, stderr=subprocess.STDOUT,
                                    env=one_thread if job.marker == PLAIN else os.environ)
        job.started = time.monotonic()
        print(f"[{clock(job.started - t0)}] {job.name}: started", flush=True)

    def finish(job: Job) -> None:
        job.ended = time.monotonic()
        job.log.seek(0)
        out = job.log.read()
        job.log.close()
        job.log = out
        print(f"\n--- {job.name} ({' '.join(job.args())}) ---\n{out}", flush=True)
        print(f"[{clock(job.ended - t0)}] {job.name}: ended after {clock(job.ended - job.started)}: {summary(out)}",
              flush=True)

    done: list[Job] = []
    running: list[Job] = []
    while queue or running:
        while queue and len(running) < SLOTS and (queue[0].marker != EXCLUSIVE or not running):
            running.append(queue.pop(0))
            start(running[-1])
        for job in [j for j in running if j.proc.poll() is not None]:
            running.remove(job)
            finish(job)
            done.append(job)
        time.sleep(0.5)

    failed = [j.name for j in done if j.proc.returncode not in (0, NO_TESTS)]
    status = f"FAILED in {', '.join(failed)}" if failed else "passed"
    parts = "; ".join(f"{j.name}: {summary(j.log)}" for j in done)
    print(f"\nmake test: {status} in {clock(time.monotonic() - t0)} ({len(done)} jobs, {SLOTS} at a time) | {parts}",
          flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
