"""Grade a patch with the official swebench harness, then with a guard that only real test results pass.

``grade(task, patch, *, run_id, timeout, ..., sandbox, output_cap_bytes) -> GradeResult`` is the RL
reward and the evaluator's verdict:
- official: ``swebench.harness.run_evaluation.run_instance`` on the raw patch (swebench's own patch
  application, eval script, log parser and ``get_eval_report``);
- guarded (sets the reward; ``guard=False``: the official verdict): 0 when the static check
  (``tasks.grading.guard.find_hacks``) finds a hacking attempt (status ``empty`` when every file of the patch
  is one, else ``unresolved``); otherwise the official verdict, and when that is resolved, also the
  clean run (``tasks.grading.clean_run``: runs that hold nothing pristine, each graded module as anonymised
  copies of its FAIL_TO_PASS tests among shape-preserving mutants, canaries and a decoy test patch, the
  applied tree inspected, the tests run as an unprivileged user with the grader's own pytest
  configuration, the behaviour compared with gold's on perturbed inputs; pytest tasks only) must pass
  every FAIL_TO_PASS / PASS_TO_PASS test with no finding.
Status (of the guarded verdict): resolved | unresolved | empty | patch_does_not_apply | infra_failure.
``hack_kinds`` lists the kinds found (``tasks.grading.guard.HACK_KINDS``; ``output_cap`` when a run's test
output went over ``output_cap_bytes``, which is a patch failure: unresolved, not infra), then the
supporting signals (``tasks.grading.guard.SIGNAL_KINDS``: frame introspection, interpreter hooks, ...), which are
reported with their line in ``hacks`` but never set the reward by themselves.

``reward`` is 1.0 / 0.0, and None for an infra failure (Docker trouble, a missing image, a
timeout before the tests started): an infra failure is never a reward of 0. Tests that run past the
timeout are the patch's doing (``tasks.grading.grade_sandbox.tests_started``): unresolved, 0. swebench's own
advisory ``infra_failure`` flag (log signatures such as "Could not resolve host", text a patch can
print) is reported in ``error`` but does not change the verdict.

Every grading container is a sandbox (``tasks.grading.grade_sandbox``): network none, ``cap_drop=ALL``,
``no-new-privileges``, the memory / pids / CPU limits of ``sandbox.*``, output streamed with a cap;
swebench's own containers (``sweb.eval.*``) get them through a wrapper on container creation.
Each grading uses a fresh swebench run id (swebench skips an instance whose report exists).
"""
from __future__ import annotations

import re
import threading
import time
import uuid
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sao_harness.envs.config import DockerConfig, SandboxConfig
from sao_harness.envs.engine import ensure_engine, pool_size
from sao_harness.envs.images import image_exists
from sao_harness.tasks.grading.clean_run import clean_run
from sao_harness.tasks.grading.diffparse import file_changes
from sao_harness.tasks.grading.grade_sandbox import GradeLimits, grading_limits, install_swebench_hooks
from sao_harness.tasks.grading.grade_status import GradeStatus
from sao_harness.tasks.grading.guard import (
    NO_PERTURBATION,
    OUTPUT_CAP,
    Hack,
    InvalidPatch,
    find_hacks,
    find_signals,
    strip_test_changes,
)
from sao_harness.tasks.model import Task

RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
DEFAULT_LOG_ROOT = Path("logs/run_evaluation")  # swebench's own default, made absolute at use


@dataclass
class Verdict:
    """One swebench run: its status, swebench's per-instance report and where its logs are."""

    status: GradeStatus
    report: dict | None = None
    log_dir: str | None = None
    error: str = ""
    seconds: float = 0.0
    over_cap: bool = False  # the test output went over the cap (a patch failure)

    @property
    def resolved(self) -> bool | None:
        return None if self.status == GradeStatus.INFRA_FAILURE else self.status == GradeStatus.RESOLVED


@dataclass
class GradeResult:
    instance_id: str
    status: GradeStatus  # the guarded verdict (sets the reward)
    official_status: GradeStatus
    resolved_official: bool | None
    resolved_guarded: bool | None
    reward: float | None
    hacking_attempts: int = 0
    stripped_files: list[str] = field(default_factory=list)
    hack_kinds: list[str] = field(default_factory=list)  # hacking attempts' kinds (tasks.grading.guard.HACK_KINDS)
    hacks: list[str] = field(default_factory=list)  # "kind: path" per finding
    report: dict[str, Any] = field(default_factory=dict)  # {"official", "guarded": swebench reports, "clean": tests}
    log_dir: str | None = None
    seconds: float = 0.0
    error: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


# --- process-wide plumbing around swebench ---------------------------------------------------
class _LogRoot:
    """swebench writes under the module global RUN_EVALUATION_LOG_DIR; point it at one absolute root
    while gradings that use it are in flight (a different root waits for them to finish)."""

    def __init__(self):
        self.cond = threading.Condition()
        self.root: Path | None = None
        self.users = 0

    @contextmanager
    def use(self, root: Path):
        # lazy: swebench is heavy
        import swebench.harness.reporting as reporting
        import swebench.harness.run_evaluation as run_evaluation

        root = Path(root).resolve()
        with self.cond:
            while self.users and self.root != root:
                self.cond.wait()
            self.root = root
            self.users += 1
            run_evaluation.RUN_EVALUATION_LOG_DIR = root
            reporting.RUN_EVALUATION_LOG_DIR = root
        try:
            yield root
        finally:
            with self.cond:
                self.users -= 1
                self.cond.notify_all()


LOG_ROOT = _LogRoot()
# swebench names its logger after the instance, so two concurrent runs of one instance would write
# into each other's logs (and their patch-apply verdicts read from those logs): one at a time.
_instance_locks: dict[str, threading.Lock] = defaultdict(threading.Lock)
_instance_locks_guard = threading.Lock()


def _instance_lock(instance_id: str) -> threading.Lock:
    with _instance_locks_guard:
        return _instance_locks[instance_id]
_client_lock = threading.Lock()
_client = None


def default_client():
    """Docker client of the project's engine (``envs.engine.ensure_engine``), made once; made anew when the
    process's pool size grew (``envs.engine.ensure_pool``): this one client serves every grading at once."""
    global _client
    with _client_lock:
        if _client is None or getattr(_client, "sao_pool_size", 0) < pool_size():
            _client = ensure_engine(DockerConfig())
        return _client


def new_run_id(prefix: str = "sao") -> str:
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"


# --- one swebench run ------------------------------------------------------------------------
def run_swebench(task, patch: str, *, run_id: str, model: str = "sao", timeout: float = 1800,
                 client=None, log_root: Path | str = DEFAULT_LOG_ROOT, skip_patch: bool = False,
                 limits: GradeLimits | None = None) -> Verdict:
    """One official swebench evaluation of ``patch`` on ``task`` (``skip_patch``: the unpatched repo),
    in a hardened container (``limits``: default ``sandbox.*`` limits and output cap)."""
    # lazy: swebench is heavy
    from swebench.harness.constants import APPLY_PATCH_FAIL, LOG_INSTANCE, LOG_REPORT
    from swebench.harness.run_evaluation import run_instance

    t0 = time.monotonic()
    if not skip_patch and not (patch or "").strip():
        return Verdict(GradeStatus.EMPTY)
    if not RUN_ID_RE.match(run_id):
        raise ValueError(f"run id {run_id!r}: use letters, digits, '.', '_' and '-' (it names containers)")
    spec = task.test_spec()
    limits = limits or GradeLimits()
    try:
        client = client or default_client()
        present = image_exists(client, spec.image)
    except Exception as e:  # engine gone, socket error: Docker trouble, not the patch's fault
        return Verdict(GradeStatus.INFRA_FAILURE, error=f"Docker engine: {type(e).__name__}: {e}",
                       seconds=time.monotonic() - t0)
    if not present:
        return Verdict(GradeStatus.INFRA_FAILURE,
                       error=f"image {spec.image} not found locally (build it: sao tasks build --task-repo DIR)")
    install_swebench_hooks()
    pred = {"instance_id": task.instance_id, "model_name_or_path": model, "model_patch": patch or ""}
    with _instance_lock(task.instance_id), LOG_ROOT.use(Path(log_root)) as root, grading_limits(limits) as g:
        log_dir = root / run_id / model.replace("/", "__") / task.instance_id
        if (log_dir / LOG_REPORT).exists():
            raise ValueError(f"run id {run_id!r} already has a report at {log_dir / LOG_REPORT}; "
                             "use a fresh run id (swebench would skip the instance)")
        try:
            result = run_instance(spec, pred, client, run_id, timeout=int(max(1, timeout)), skip_patch=skip_patch)
        except Exception as e:  # run_instance catches most of its own errors; anything else is Docker trouble
            return Verdict(GradeStatus.INFRA_FAILURE, log_dir=str(log_dir), error=f"{type(e).__name__}: {e}",
                           seconds=time.monotonic() - t0)
    seconds = time.monotonic() - t0
    if g.over_cap:
        return Verdict(GradeStatus.UNRESOLVED, None, str(log_dir),
                       f"test output over the cap of {limits.output_cap_bytes} bytes (a patch failure)", seconds,
                       over_cap=True)
    if g.tests_timed_out:  # the patch's code ran past the limit: never an infra failure (no reward)
        return Verdict(GradeStatus.UNRESOLVED, None, str(log_dir),
                       f"the tests ran past the timeout of {timeout:g} s (a patch failure)", seconds)
    if result is not None:
        report = result[1][task.instance_id]
        status = GradeStatus.RESOLVED if report.get("resolved") else GradeStatus.UNRESOLVED
        # swebench's infra_failure flag is advisory and read from log text the patch controls (a patch
        # can print "Could not resolve host"), so it never turns a verdict into "no reward"; noted only
        err = f"swebench flags a likely infra failure: {report['infra_failure_reason']}" \
            if report.get(GradeStatus.INFRA_FAILURE) else ""  # swebench's flag of that name
        return Verdict(status, report, str(log_dir), err, seconds)
    log = log_dir / LOG_INSTANCE
    text = log.read_text(errors="replace") if log.is_file() else ""
    if APPLY_PATCH_FAIL in text:
        return Verdict(GradeStatus.NO_APPLY, None, str(log_dir), "git apply and patch both rejected the patch",
                       seconds)
    if "Test timed out" in text:
        return Verdict(GradeStatus.INFRA_FAILURE, None, str(log_dir), f"eval script timed out after {timeout:g} s",
                       seconds)
    lines = [ln for ln in text.splitlines() if " - ERROR - " in ln or "Error" in ln]
    return Verdict(GradeStatus.INFRA_FAILURE, None, str(log_dir),
                   (lines[-1] if lines else "swebench run failed") + f" (see {log})", seconds)


# --- the reward ------------------------------------------------------------------------------
def _hacked_verdict(official: Verdict, hacks, n_files: int) -> Verdict:
    """The guarded verdict of a patch with hacking findings: never resolved."""
    if official.status == GradeStatus.NO_APPLY:
        return Verdict(GradeStatus.NO_APPLY, log_dir=official.log_dir)
    every_file = {h.index for h in hacks} >= set(range(n_files))
    why = "hacking attempt: " + "; ".join(dict.fromkeys(str(h) for h in hacks))
    return Verdict(GradeStatus.EMPTY if every_file else GradeStatus.UNRESOLVED, log_dir=official.log_dir, error=why)


def grade(task, patch: str, *, run_id: str | None = None, timeout: float = 1800, client=None,
          guard: bool = True, model: str = "sao", log_root: Path | str = DEFAULT_LOG_ROOT,
          sandbox: SandboxConfig | None = None, output_cap_bytes: int | None = None) -> GradeResult:
    """Official and guarded verdicts of ``patch`` on ``task`` (a ``Task`` or a swebench row dict; see
    module doc). ``run_id`` must be fresh (default: a new one). ``sandbox`` (limits of the grading
    containers, default ``SandboxConfig()``) and ``output_cap_bytes`` (``grading.output_cap_bytes``)."""
    t0 = time.monotonic()
    if isinstance(task, dict):
        task = Task.from_row(task)
    run_id = run_id or new_run_id()
    patch = patch or ""
    iid = task.instance_id
    limits = GradeLimits.from_config(sandbox, output_cap_bytes)
    hacks = find_hacks(patch, task.test_patch, task.repo) if guard and patch.strip() else []
    signals = find_signals(patch, task.test_patch, task.repo) if guard and patch.strip() else []
    try:
        stripped = strip_test_changes(patch, task.test_patch) if guard else None
    except InvalidPatch as e:
        return GradeResult(iid, GradeStatus.NO_APPLY, GradeStatus.NO_APPLY, False, False, 0.0,
                           error=f"invalid patch: {e}",
                           hacking_attempts=len({h.index for h in hacks}), hacks=[str(h) for h in hacks],
                           hack_kinds=list(dict.fromkeys(h.kind for h in hacks)), seconds=time.monotonic() - t0)
    official = run_swebench(task, patch, run_id=run_id, model=model, timeout=timeout, client=client,
                            log_root=log_root, limits=limits)
    kinds = [h.kind for h in hacks] + ([OUTPUT_CAP] if official.over_cap else [])
    clean = None
    if not guard or (official.status != GradeStatus.RESOLVED and not hacks):
        final = official
    elif not hacks and not (task.log_parser or "").startswith("parse_log_pytest"):
        final = official  # the clean run reads pytest's JUnit report: pytest tasks only (docs/threats.md)
    elif hacks:
        final = _hacked_verdict(official, hacks, len(file_changes(patch)))
    else:
        clean = clean_run(task, patch, client=client or default_client(), limits=limits, timeout_s=timeout,
                          log_dir=Path(log_root).resolve() / f"{run_id}.clean" / model.replace("/", "__") / iid)
        final = Verdict(clean.status, official.report, clean.log_dir or official.log_dir, clean.error,
                        clean.seconds, clean.over_cap)
        kinds += [h.kind for h in clean.hacks] + ([OUTPUT_CAP] if clean.over_cap else [])
        hacks = hacks + clean.hacks
        if clean.no_perturbation:  # said in the grade, never a silent pass
            signals = signals + [Hack(NO_PERTURBATION, ", ".join(clean.no_perturbation), -1)]
    reward = None if final.status == GradeStatus.INFRA_FAILURE else float(final.status == GradeStatus.RESOLVED)
    errors = "; ".join(dict.fromkeys(e for e in (official.error, final.error) if e))
    attempts = len({h.index for h in hacks}) + (1 if OUTPUT_CAP in kinds else 0)  # the runs' findings: index -1
    return GradeResult(
        instance_id=iid, status=final.status, official_status=official.status,
        resolved_official=official.resolved, resolved_guarded=final.resolved, reward=reward,
        hacking_attempts=attempts, stripped_files=list(stripped.stripped_files) if stripped else [],
        hack_kinds=list(dict.fromkeys(kinds + [h.kind for h in signals])), hacks=[str(h) for h in hacks + signals],
        report={"official": official.report, "guarded": final.report,
                "clean": clean.tests_status if clean else None, "mutated": clean.mutated if clean else None,
                "behaviour": {"compared": clean.probed, "no_perturbation": clean.no_perturbation} if clean else None},
        log_dir=final.log_dir or official.log_dir, seconds=time.monotonic() - t0, error=errors)
