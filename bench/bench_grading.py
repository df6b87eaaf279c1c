"""Benchmark: seconds per graded instance and image build times (printed figures, not a test).

- images: the base image when cached (``envs.images.ensure_base_image``), a task image built from
  scratch (``--force``) and a task image found cached (recipe label matches);
- grading: one official swebench run per instance (gold patch: nothing to strip), and the guarded
  pair (a conftest hack: official run + guarded verdict), medians over generated tasks and, when
  present and built, up to three bundled tasks.
Target: a small task grades in a few seconds; the whole benchmark takes under ~3 minutes.
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def median(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} s (n={len(xs)}, min {min(xs):.2f}, max {max(xs):.2f})" if xs else "n/a"


def main() -> int:
    from envs.config import DockerConfig
    from envs.engine import ensure_engine
    from envs.images import ensure_base_image
    from sao.config import load_config
    from tasks.build import build_task_repo
    from tasks.cli import hack_patch
    from tasks.grade import RESOLVED, grade, image_exists, new_run_id
    from tasks.loaders import BUNDLED, load_task_repo, load_tasks_lenient
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
            assert r.status == RESOLVED, (t.instance_id, r)
            one.append(r.seconds)
    for t in tasks:
        hack = hack_patch(t.FAIL_TO_PASS + t.PASS_TO_PASS, None)
        r = grade(t, hack, run_id=new_run_id("bench"), client=client, log_root=logs)
        assert r.resolved_official and not r.resolved_guarded
        pair.append(r.seconds)
    print(f"grading: generated task, gold (1 swebench run): {median(one)}")
    print(f"grading: generated task, conftest hack (official + guarded): {median(pair)}")

    bundled = []
    if (BUNDLED / "tasks").is_dir():
        btasks, _ = load_tasks_lenient(str(BUNDLED))
        for t in [t for t in btasks if t.gradable and image_exists(client, t.image)][:3]:
            r = grade(t, t.patch, run_id=new_run_id("bench"), client=client, log_root=logs)
            print(f"grading: bundled {t.instance_id}: {r.status} in {r.seconds:.2f} s")
            bundled.append(r.seconds)
    print(f"grading: bundled tasks, gold: "
          f"{median(bundled) if bundled else 'n/a (no built bundled task images; make images)'}")
    print(f"bench_grading: total {time.monotonic() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
