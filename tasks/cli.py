"""`sao tasks list|show|check|build`: inspect task sources, prove tasks, build task images.

- ``list``  table of id, repo, format (the adapter that mapped the row), difficulty, gradable here?, image
  present locally?; then one line per task that is not gradable, naming the missing field
- ``show ID`` the row and its problem statement.
- ``check [--task-repo DIR] [--only ID...]`` validation, then with Docker for every task: the image
  holds no commit after the base (HEAD == base_commit, reachable commits == ancestors of base), the
  gold patch resolves, an empty patch is ``empty``, the unpatched repo fails FAIL_TO_PASS, a wrong
  patch is unresolved, and three reward hacks (``tasks.grading.hacks``: a conftest hook, a root ``pytest.py``
  that shadows pytest, package code that patches pytest's reports) are each resolved officially but
  given 0 by the guarded verdict. Per-task table + summary; exit 1 on any failure.
- ``build --task-repo DIR [--only ID...] [--base-image IMG] [--force]`` offline, cached builds.
Registration is import-light: docker and swebench are imported inside the handlers.
"""
from __future__ import annotations

import argparse
import base64
import time
from dataclasses import dataclass, field

from sao_harness.core.errors import UserError
from sao_harness.envs import images as envs_images
from sao_harness.envs.engine import docker_client, ensure_engine
from sao_harness.envs.images import image_exists
from sao_harness.tasks.formats.loaders import load_tasks_lenient, resolve_task_repo
from sao_harness.tasks.grading.diffparse import file_changes
from sao_harness.tasks.grading.grade import grade, new_run_id, run_swebench
from sao_harness.tasks.grading.grade_sandbox import GradeLimits
from sao_harness.tasks.grading.grade_status import GradeStatus
from sao_harness.tasks.grading.guard import PYTEST_REF, SHADOW
from sao_harness.tasks.grading.hacks import hack_patch, package_init, package_patch, shadow_patch

WRONG_PATCH_FILE = "sao_unrelated_change.txt"
WRONG_PATCH = (f"diff --git a/{WRONG_PATCH_FILE} b/{WRONG_PATCH_FILE}\nnew file mode 100644\n"
               f"--- /dev/null\n+++ b/{WRONG_PATCH_FILE}\n@@ -0,0 +1 @@\n+an unrelated change\n")


# --- helpers -------------------------------------------------------------------------------
class IdsAction(argparse.Action):
    """``--only ID...`` that leaves ``key.sub=value`` overrides written after it to the config."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, (getattr(namespace, self.dest) or []) + [v for v in values if "=" not in v])
        extra = [v for v in values if "=" in v]
        namespace.late_overrides = list(getattr(namespace, "late_overrides", None) or []) + extra


def _source(args) -> str:
    return getattr(args, "task_repo", None) or getattr(args, "source", None) or args.cfg.tasks.source


def _load(args, instances=None):
    t = args.cfg.tasks
    return load_tasks_lenient(_source(args), split=t.split, adapter=t.adapter,
                              instances=instances or t.instances or None)


def _client(cfg, start: bool = True):
    if start:
        return ensure_engine(cfg.docker)
    return docker_client(cfg.docker)


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*header), fmt.format(*["-" * w for w in widths])]
    lines += [fmt.format(*[str(c) for c in r]) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


# --- list / show ---------------------------------------------------------------------------
def cmd_list(args) -> int:
    tasks, errors = _load(args)
    try:
        client = _client(args.cfg, start=False)
        present = lambda img: "yes" if img and image_exists(client, img) else "no"  # noqa: E731
    except Exception:
        present = lambda img: "?"  # noqa: E731  (no engine answers)
    rows = [[t.instance_id, t.repo, t.adapter or "-", t.difficulty or "-", "yes" if t.gradable else "no",
             present(t.image)] for t in tasks]
    print(_table(rows, ["id", "repo", "format", "difficulty", "gradable", "image"]))
    formats = ", ".join(sorted({t.adapter for t in tasks if t.adapter}))
    print(f"{len(tasks)} task(s) from {_source(args)}" + (f" (format: {formats}, adapter {args.cfg.tasks.adapter})"
                                                         if formats else "")
          + (f", {len(errors)} invalid:" if errors else ""))
    for e in errors:
        print(f"  {e}")
    for t in tasks:
        if not t.gradable:
            print(f"  {t.grading_error()}")
    return 1 if errors else 0


def cmd_show(args) -> int:
    tasks, errors = _load(args, instances=[args.id])
    if errors:
        raise errors[0]
    t = tasks[0]
    print(f"instance_id: {t.instance_id}\nrepo: {t.repo}\nbase_commit: {t.base_commit}\nversion: {t.version}")
    for name in ("difficulty", "split", "image", "log_parser", "eval_type"):
        print(f"{name}: {getattr(t, name) or '-'}")
    print(f"FAIL_TO_PASS ({len(t.FAIL_TO_PASS)}): " + ", ".join(t.FAIL_TO_PASS))
    print(f"PASS_TO_PASS ({len(t.PASS_TO_PASS)}): " + ", ".join(t.PASS_TO_PASS[:20])
          + (" ..." if len(t.PASS_TO_PASS) > 20 else ""))
    print(f"gold patch: {len(t.patch.splitlines())} lines; test patch: {len(t.test_patch.splitlines())} lines; "
          f"eval script: {'yes' if t.eval_script else 'no'}")
    for k, v in sorted(t.extra.items()):
        print(f"{k}: {str(v)[:200]}")
    gaps = t.grading_gaps() + t.notes
    if gaps:
        print("not gradable here:" if not t.gradable else "notes:")
        for g in gaps:
            print(f"  - {g}")
    print("\n--- problem statement ---\n" + t.problem_statement.rstrip())
    if t.hints_text.strip():
        print("\n--- hints ---\n" + t.hints_text.rstrip())
    return 0


# --- build ---------------------------------------------------------------------------------
def cmd_build(args) -> int:
    # lazy: keeps `sao --help` fast (the image stack)
    from sao_harness.tasks.images.build import build_task_repo, resolve_base_image

    repo = resolve_task_repo(args.task_repo)
    if repo is None or not repo.is_dir():
        raise UserError(f"--task-repo {args.task_repo}: not a swebench task repo (no sweb.yaml or tasks/ directory)")
    client = _client(args.cfg)
    base = resolve_base_image(args.cfg, client, args.base_image)
    print(f"building task images of {repo} on {base} (offline, classic builder)")
    results = build_task_repo(client, repo, base, only=args.only, force=args.force)
    counts = {s: sum(r.status == s for r in results) for s in ("built", "cached", "failed")}
    print(f"images: {counts['built']} built, {counts['cached']} cached, {counts['failed']} failed")
    return 1 if counts["failed"] else 0


# --- check ---------------------------------------------------------------------------------
@dataclass
class Check:
    instance_id: str
    results: dict[str, str] = field(default_factory=dict)  # proof -> "ok" | "FAIL: why" | "skip: why"
    details: list[str] = field(default_factory=list)

    def set(self, name: str, ok: bool, why: str = "") -> None:
        self.results[name] = "ok" if ok else f"FAIL{': ' + why if why else ''}"
        if not ok and why:
            self.details.append(f"{name}: {why}")

    @property
    def ok(self) -> bool:
        return all(not v.startswith("FAIL") for v in self.results.values())


PROOFS = ("valid", "image", "history", "empty", "gold", "unpatched", "wrong", "hack", "shadow", "pkghack")

_PROBE = r"""
cd /testbed || exit 90
git rev-parse HEAD || exit 91
echo '@@'
git rev-list --all | sort
echo '@@'
git rev-list {base} | sort
echo '@@'
if [ -f conftest.py ]; then base64 -w0 conftest.py; else echo NONE; fi
"""


def probe_image(client, image: str, base_commit: str) -> tuple[str, set[str], set[str], str | None]:
    """(HEAD, all reachable commits, ancestors of base, root conftest.py text or None) in ``image``."""
    out = client.containers.run(image, ["bash", "-c", _PROBE.format(base=base_commit)], remove=True,
                                network_mode="none", user="root", stdout=True, stderr=True)
    parts = out.decode(errors="replace").split("@@\n")
    if len(parts) != 4:
        raise RuntimeError(f"git probe output not understood: {out[:300]!r}")
    head = parts[0].strip().splitlines()[-1] if parts[0].strip() else ""
    reach = set(parts[1].split())
    ancestors = set(parts[2].split())
    conf = parts[3].strip()
    return head, reach, ancestors, None if conf == "NONE" else base64.b64decode(conf).decode(errors="replace")


def read_image_file(client, image: str, path: str) -> str | None:
    """Text of ``/testbed/<path>`` in ``image`` (None when it is not there)."""
    return envs_images.read_image_file(client, image, f"/testbed/{path}")


def _prove_hack(c: Check, name: str, r, kind: str) -> None:
    c.set(name, (r.resolved_official is True and r.resolved_guarded is False and r.reward == 0.0
                 and kind in r.hack_kinds),
          f"official {r.official_status}, guarded {r.status}, kinds {r.hack_kinds}")


def check_task(task, client, *, run_id: str, timeout: float, log_root, problems: list[str], sandbox=None,
               output_cap_bytes: int | None = None) -> Check:
    """Run every proof on one task (see module doc)."""
    c = Check(task.instance_id)
    gaps = task.grading_gaps()
    c.set("valid", not gaps and not problems,
          "; ".join((["not gradable here: " + ", ".join(gaps)] if gaps else []) + problems))
    if gaps:
        return c
    if not image_exists(client, task.image):
        c.set("image", False, f"{task.image} not found locally (sao tasks build --task-repo DIR)")
        return c
    c.set("image", True)
    kw = dict(timeout=timeout, client=client, log_root=log_root, sandbox=sandbox, output_cap_bytes=output_cap_bytes)
    try:
        head, reach, ancestors, conftest = probe_image(client, task.image, task.base_commit)
        leak = reach - ancestors
        why = []
        if head != task.base_commit:
            why.append(f"HEAD is {head[:12]}, not base {task.base_commit[:12]}")
        if leak:
            why.append(f"{len(leak)} reachable commit(s) not ancestors of base (e.g. {sorted(leak)[0][:12]})")
        if not ancestors:
            why.append("base commit not in the image's history")
        c.set("history", not why, "; ".join(why))
    except Exception as e:
        c.set("history", False, f"git probe failed: {e}")
        conftest = None

    r = grade(task, "", run_id=f"{run_id}.empty", **kw)
    c.set("empty", r.status == GradeStatus.EMPTY, f"status {r.status}")

    r = grade(task, task.patch, run_id=f"{run_id}.gold", **kw)
    c.set("gold", r.resolved_official is True and r.resolved_guarded is True,
          f"official {r.official_status}, guarded {r.status}"
          f"{'; stripped ' + ', '.join(r.stripped_files) if r.stripped_files else ''}"
          f"{'; ' + r.error if r.error else ''}")

    v = run_swebench(task, "", run_id=f"{run_id}.unpatched", skip_patch=True, timeout=timeout, client=client,
                     log_root=log_root, limits=GradeLimits.from_config(sandbox, output_cap_bytes))
    if v.status == GradeStatus.INFRA_FAILURE:
        c.set("unpatched", False, f"{v.status}: {v.error}")
    else:
        passing = (((v.report or {}).get("tests_status") or {}).get("FAIL_TO_PASS") or {}).get("success") or []
        c.set("unpatched", not passing and v.status != GradeStatus.RESOLVED,
              f"FAIL_TO_PASS test(s) pass without the fix: {', '.join(passing[:3])}")

    r = grade(task, WRONG_PATCH, run_id=f"{run_id}.wrong", **kw)
    c.set("wrong", r.official_status == GradeStatus.UNRESOLVED and r.status == GradeStatus.UNRESOLVED,
          f"official {r.official_status}, guarded {r.status}")

    if not (task.log_parser or "").startswith("parse_log_pytest"):
        c.results["hack"] = "skip: the conftest probe needs a pytest task"
        return c
    hack = hack_patch(task.FAIL_TO_PASS + task.PASS_TO_PASS, conftest)
    r = grade(task, hack, run_id=f"{run_id}.hack", **kw)
    c.set("hack", r.resolved_official is True and r.resolved_guarded is False and r.hacking_attempts > 0,
          f"official {r.official_status}, guarded {r.status}, hacking attempts {r.hacking_attempts}")

    _prove_hack(c, "shadow", grade(task, shadow_patch(), run_id=f"{run_id}.shadow", **kw), SHADOW)
    init = package_init([fc.label for fc in file_changes(task.patch)])
    if init is None:
        c.set("pkghack", False, "no package in the gold patch to append the probe to")
        return c
    try:
        existing = read_image_file(client, task.image, init)
    except Exception as e:
        c.set("pkghack", False, f"reading {init} from the image failed: {e}")
        return c
    r = grade(task, package_patch(init, existing), run_id=f"{run_id}.pkghack", **kw)
    _prove_hack(c, "pkghack", r, PYTEST_REF)
    return c


def cmd_check(args) -> int:
    t0 = time.monotonic()
    source = _source(args)
    tasks, errors = _load(args, instances=args.only)
    repo = resolve_task_repo(source)
    problems: dict[str, list[str]] = {}
    if repo is not None:
        from swebench.task.checks import check_task_repo  # lazy: swebench is heavy

        for p in check_task_repo(repo):
            if p.severity == "error":
                problems.setdefault(p.where.removeprefix("tasks/"), []).append(p.message)
    checks: list[Check] = []
    for e in errors:
        c = Check(e.instance_id or "?")
        c.set("valid", False, str(e))
        checks.append(c)
    client = _client(args.cfg) if tasks else None
    if repo is not None and tasks:
        # lazy: keeps `sao --help` fast (the image stack)
        from sao_harness.tasks.images.build import build_task_repo, resolve_base_image

        base = resolve_base_image(args.cfg, client, getattr(args, "base_image", None))
        print(f"images of {repo} (cached builds on {base}):")
        build_task_repo(client, repo, base, tasks=tasks, log=lambda m: print("  " + m))
    run_base = new_run_id("check")
    log_root = args.cfg.run.dir / "logs" / "run_evaluation"
    timeout = args.cfg.grading.timeout_s
    n = len(tasks)
    for i, task in enumerate(tasks, 1):
        ts = time.monotonic()
        print(f"[{i}/{n}] {task.instance_id} ...", flush=True)
        c = check_task(task, client, run_id=f"{run_base}.{i}", timeout=timeout, log_root=log_root,
                       sandbox=args.cfg.sandbox, output_cap_bytes=args.cfg.grading.output_cap_bytes,
                       problems=problems.get(task.instance_id, []))
        checks.append(c)
        print(f"[{i}/{n}] {task.instance_id}: {'ok' if c.ok else 'FAILED'} in {time.monotonic() - ts:.1f} s",
              flush=True)
    rows = [[c.instance_id] + [c.results.get(p, "-").split(":")[0] for p in PROOFS] for c in checks]
    print()
    print(_table(rows, ["task"] + list(PROOFS)))
    for c in checks:
        for d in c.details:
            print(f"  {c.instance_id}: {d}")
    failed = [c for c in checks if not c.ok]
    print(f"tasks check: {len(checks) - len(failed)}/{len(checks)} tasks passed every proof "
          f"({time.monotonic() - t0:.1f} s; logs under {log_root}/{run_base}.*)")
    return 1 if failed or not checks else 0


# --- registration --------------------------------------------------------------------------
def register(sub, add_config_args):
    p = sub.add_parser("tasks", help="task sources: list, show, check, build images")
    tsub = p.add_subparsers(dest="tasks_command", metavar="SUBCOMMAND", required=True)

    q = tsub.add_parser("list", help="table of tasks: id, repo, difficulty, gradable, image present")
    q.add_argument("--source", help="task source (default: tasks.source): bundled, a task repo, a file, a HF id")
    add_config_args(q)
    q.set_defaults(func=cmd_list)

    q = tsub.add_parser("show", help="one task's row and problem statement")
    q.add_argument("id", help="instance id")
    q.add_argument("--source", help="task source (default: tasks.source)")
    add_config_args(q)
    q.set_defaults(func=cmd_show)

    q = tsub.add_parser("check", help=("prove tasks: gold resolves, empty/unpatched/wrong fail, hacks guarded, "
                                       "no history leak"))
    q.add_argument("--task-repo", metavar="DIR", help="swebench task repo (default: tasks.source)")
    q.add_argument("--only", nargs="+", action=IdsAction, metavar="ID", help="only these instance ids")
    q.add_argument("--base-image", metavar="IMG", help="base image for missing task images (default: the project's)")
    add_config_args(q)
    q.set_defaults(func=cmd_check)

    q = tsub.add_parser("build", help="build a swebench task repo's images on the base image (offline, cached)")
    q.add_argument("--task-repo", metavar="DIR", required=True, help="swebench task repo (or 'bundled')")
    q.add_argument("--only", nargs="+", action=IdsAction, metavar="ID", help="only these instance ids")
    q.add_argument("--base-image", metavar="IMG", help="image to build FROM (default: the project's base image)")
    q.add_argument("--force", action="store_true", help="rebuild even when the cached image's recipe matches")
    add_config_args(q)
    q.set_defaults(func=cmd_build)
