"""Benchmark: seconds per graded instance and image build times (printed figures, not a test).

- images: the base image when cached (``envs.images.ensure_base_image``), a task image built from
  scratch (``--force``) and a task image found cached (recipe label matches);
- grading: the gold patch per instance (official run + guarded verdict), and the guarded
  pair (a conftest hack: official run + guarded verdict), medians over generated tasks and, when
  present and built, up to three bundled tasks;
- grading time per instance, this guard vs the previous one (gold patches, bundled tasks): the previous
  guard is the one of commit ``--previous`` (default ``PREVIOUS_GUARD``), checked out into a temporary
  git worktree and graded by a subprocess that imports the project from there; the two alternate task
  by task in the same run, each timing its own ``grade()`` call.
Targets: a small task grades in a few seconds; this guard <= 2.5x the previous one per instance; the
whole benchmark takes under ~5 minutes.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, verdict

PREVIOUS_GUARD = "a89a966"  # the last commit of the round-3 guard (official + a real and a mutation run)
_PREVIOUS = """
import json, sys, types
pkg = types.ModuleType("sao_harness"); pkg.__path__ = [sys.argv[1]]; sys.modules["sao_harness"] = pkg
sys.path.insert(0, sys.argv[1])
from sao_harness.tasks.grading.grade import default_client, grade, new_run_id
from sao_harness.tasks.formats.loaders import BUNDLED, load_tasks_lenient
tasks = {t.instance_id: t for t in load_tasks_lenient(str(BUNDLED))[0]}
client = default_client()
for line in sys.stdin:
    t = tasks[line.strip()]
    r = grade(t, t.patch, run_id=new_run_id("bench-prev"), client=client, log_root=sys.argv[2])
    print(json.dumps({"status": str(r.status), "seconds": r.seconds}), flush=True)
"""


class PreviousGuard:
    """The previous guard, graded in a subprocess from a git worktree of ``rev`` (see the module doc)."""

    def __init__(self, rev: str):
        self.rev, self.dir = rev, Path(tempfile.mkdtemp(prefix="bench-prev-guard-"))

    def __enter__(self):
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(self.dir / "tree"), self.rev],
                       check=True, capture_output=True)
        self.proc = subprocess.Popen([sys.executable, "-c", _PREVIOUS, str(self.dir / "tree"), str(self.dir / "logs")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        return self

    def grade(self, instance_id: str) -> float:
        self.proc.stdin.write(instance_id + "\n")
        self.proc.stdin.flush()
        out = json.loads(self.proc.stdout.readline())
        assert out["status"] == "resolved", (instance_id, out)
        return out["seconds"]

    def __exit__(self, *exc):
        self.proc.stdin.close()
        self.proc.wait(60)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(self.dir / "tree")],
                       capture_output=True)


def median(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} s (n={len(xs)}, min {min(xs):.2f}, max {max(xs):.2f})" if xs else "n/a"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--previous", default=PREVIOUS_GUARD, help="the commit whose guard is the baseline")
    ap.add_argument("--repeats", type=int, default=2, help="rounds over the bundled tasks for the ratio")
    args = ap.parse_args()
    from sao_harness.envs.config import DockerConfig
    from sao_harness.envs.engine import ensure_engine
    from sao_harness.envs.images import ensure_base_image, image_exists
    from sao_harness.sao.config import load_config
    from sao_harness.tasks.formats.loaders import BUNDLED, load_task_repo, load_tasks_lenient
    from sao_harness.tasks.grading import clean_run
    from sao_harness.tasks.grading.clean_run import RUNS
    from sao_harness.tasks.grading.grade import grade, new_run_id
    from sao_harness.tasks.grading.grade_status import GradeStatus
    from sao_harness.tasks.grading.hacks import hack_patch
    from sao_harness.tasks.images.build import build_task_repo
    from tests.support.task_repos import make_task_repo

    t_start = time.monotonic()
    cfg = load_config(None)
    client = ensure_engine(DockerConfig())
    t0 = time.monotonic()
    base = ensure_base_image(client, cfg.docker, log=lambda m: None)
    t_base = time.monotonic() - t0
    tmp = Path(tempfile.mkdtemp(prefix="bench-grading-"))
    repo = make_task_repo(tmp / "repo")
    forced = build_task_repo(client, repo, base, force=True, nocache=True, log=lambda m: None)
    cached = build_task_repo(client, repo, base, log=lambda m: None)
    print(f"images: base image (cached) ready in {t_base:.2f} s: {base}")
    print(f"images: task image built from scratch: {median([r.seconds for r in forced])}")
    print(f"images: task image cached (recipe match): {median([r.seconds for r in cached])}")

    tasks = load_task_repo(repo)
    logs = tmp / "logs"
    one, pair = [], []
    for _rep in range(3):
        for t in tasks:
            r = grade(t, t.patch, run_id=new_run_id("bench"), client=client, log_root=logs)
            assert r.status == GradeStatus.RESOLVED, (t.instance_id, r)
            one.append(r.seconds)
    for t in tasks:
        hack = hack_patch(t.FAIL_TO_PASS + t.PASS_TO_PASS, None)
        r = grade(t, hack, run_id=new_run_id("bench"), client=client, log_root=logs)
        assert r.resolved_official and not r.resolved_guarded
        pair.append(r.seconds)
    print(f"grading: generated task, gold (official + guarded): {median(one)}")
    print(f"grading: generated task, conftest hack (official + guarded): {median(pair)}")

    bundled, built = [], []
    if (BUNDLED / "tasks").is_dir():
        btasks, _ = load_tasks_lenient(str(BUNDLED))
        built = [t for t in btasks if t.gradable and image_exists(client, t.image)][:3]
        for t in built:
            r = grade(t, t.patch, run_id=new_run_id("bench"), client=client, log_root=logs)
            print(f"grading: bundled {t.instance_id}: {r.status} in {r.seconds:.2f} s")
            bundled.append(r.seconds)
    print(f"grading: bundled tasks, gold: "
          f"{median(bundled) if bundled else 'n/a (no built bundled task images; make images)'}")

    old, new, cold = [], [], []  # per instance, alternating so that load drifts hit both alike
    with PreviousGuard(args.previous) as previous:
        for rep in range(args.repeats + 1):
            for t in built:
                old.append(previous.grade(t.instance_id))
                if rep == 0:  # a task's first grading in a process: its pristine state and gold's records made
                    clean_run._pristine.clear(), clean_run._gold.clear()
                r = grade(t, t.patch, run_id=new_run_id("bench"), client=client, log_root=logs)
                assert r.status == GradeStatus.RESOLVED and r.report["behaviour"] is not None, (t.instance_id, r)
                (cold if rep == 0 else new).append(r.seconds)
    if not old:
        print("grading: previous guard vs this one: n/a (no built bundled task images; make images)")
    else:
        ratio, first = (statistics.median(xs) / statistics.median(old) for xs in (new, cold))
        print(f"grading per instance, previous guard ({args.previous}: official + real and mutation runs): "
              f"{median(old)}")
        print(f"grading per instance, this guard (official + {RUNS} variant runs + gold probe, cached): {median(new)}")
        print(f"grading per instance, this guard, a task's first grading (pristine state and gold made): "
              f"{median(cold)} = {first:.2f}x the previous")
        print(f"grading: this / previous guard = {ratio:.2f}x (target <= 2.5x): {verdict(ratio <= 2.5)}")
    print(f"bench_grading: total {time.monotonic() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
