"""Benchmark: seconds per graded instance and image build times (printed figures, not a test).

- images: the base image when cached (``envs.images.ensure_base_image``), a task image built from
  scratch (``--force``) and a task image found cached (recipe label matches);
- grading: the gold patch per instance (official run + guarded verdict), and the guarded
  pair (a conftest hack: official run + guarded verdict), medians over generated tasks and, when
  present and built, up to three bundled tasks;
- grading time per instance, old vs new guard (gold patches): "old" is the guard without the mutation
  run (the official run + one clean run, ``mutation=False``, whose tree check and canaries add
  ~0.1 s), "new" the whole guarded verdict (the official run + the real run and the
  mutation run, started together).
Targets: a small task grades in a few seconds; new <= 2x old per instance; the whole benchmark takes
under ~4 minutes.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import verdict


def median(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} s (n={len(xs)}, min {min(xs):.2f}, max {max(xs):.2f})" if xs else "n/a"


def main() -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    from sao_harness.envs.config import DockerConfig
    from sao_harness.envs.engine import ensure_engine
    from sao_harness.envs.images import ensure_base_image
    from sao_harness.sao.config import load_config
    from sao_harness.tasks.build import build_task_repo
    from sao_harness.tasks.clean_run import clean_run
    from sao_harness.tasks.grade import grade, image_exists, new_run_id, run_swebench
    from sao_harness.tasks.grade_sandbox import GradeLimits
    from sao_harness.tasks.grade_status import GradeStatus
    from sao_harness.tasks.hacks import hack_patch
    from sao_harness.tasks.loaders import BUNDLED, load_task_repo, load_tasks_lenient
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

    old, new = [], []  # per instance, alternating so that load drifts hit both alike
    for t in tasks + built:
        t0 = time.monotonic()
        v = run_swebench(t, t.patch, run_id=new_run_id("bench"), client=client, log_root=logs)
        c = clean_run(t, t.patch, client=client, limits=GradeLimits(), timeout_s=600, mutation=False)
        assert v.status == GradeStatus.RESOLVED and c.status == GradeStatus.RESOLVED, (t.instance_id, v, c)
        old.append(time.monotonic() - t0)
        r = grade(t, t.patch, run_id=new_run_id("bench"), client=client, log_root=logs)
        assert r.status == GradeStatus.RESOLVED and r.report["mutated"] is not None, (t.instance_id, r)
        new.append(r.seconds)
    ratio = statistics.median(new) / statistics.median(old)
    print(f"grading per instance, old guard shape (official + one clean run): {median(old)}")
    print(f"grading per instance, new guard (official + tree check + canaries + mutation run): {median(new)}")
    print(f"grading: new / old = {ratio:.2f}x (target <= 2x): {verdict(ratio <= 2)}")
    print(f"bench_grading: total {time.monotonic() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
