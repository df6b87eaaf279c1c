"""Faults injected during a run (issue 37, item 2): what each does to the episodes in flight and the traces.

A `sao rollout` (``run_rollout``, in this process) and a `sao train` (``train``: real Ray actors, the SAO
update of the tiny model) run real OpenHands episodes in Docker sandboxes on bundled tasks (compact agent
profile; the expert engine: the gold patch as edits, no model compute, so every episode that is not hit
resolves with reward 1.0). While 2-3 episodes are in flight, one fault:

- engine restart: the project dockerd is stopped and started again (every sandbox dies with it);
- OOM kill: one sandbox's PID 1 is made the OOM killer's choice and a memory hog runs past the sandbox's
  memory limit: the kernel kills it, the container exits with ``OOMKilled``;
- disk full: the run directory (traces) is a 64 MiB tmpfs of its own, filled to its last byte;
- worker kill: `sao train`: SIGKILL to a rollout worker's process (a Ray actor) running an episode;
  `sao rollout` (episodes in threads of one process): SIGKILL to the `sao rollout` process itself;
- engine replica kill: `sao train`: SIGKILL to the engine replica's process; `sao rollout` (the engine is in
  the rollout's process): the engine dies, every later request fails;
- hung commands: `sao rollout`: one episode's first call is ``sleep 100000`` under a 5 s
  ``agent.max_command_s``; `sao train`: ``docker pause`` (SIGSTOP, the freezer) of one sandbox.

Checks per row: every episode hit ends ``infra_error`` with no reward (never a 0) or is retried per
``rollout.max_retries``; every shard written before the fault is still there, byte for byte, and every shard
reads back whole (``TraceStore`` and pyarrow); the run goes on, or stops with a clear message and resumes
(the same command again) to the fault-free result: every task resolved, reward 1.0.

Columns: episodes affected: in flight and hit; infra errors: stored as ``infra_error`` (rollout: final
attempts, only those are stored; train: every attempt); retried: attempts run again per
``rollout.max_retries``; traces lost: shards written before the fault that are gone or changed, plus shards
that do not read back. An episode the fault kept from being stored at all (disk full, a killed process) is
said in the last column, and run again by the resume.

    python bench/bench_faults.py [--only engine_restart,oom_kill,...] [--mode rollout|train]

Root only (dockerd, /proc/<pid>/oom_score_adj, mount). The engine-restart rows stop the project dockerd: run
them when nothing else uses the engine; the disk-full rows fill a 64 MiB tmpfs of their own, never a real
disk. tests/harness/test_faults.py runs every row (slow, docker).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq
from _common import ROOT

from sao_harness.envs.config import DockerConfig
from sao_harness.envs.engine import ProjectEngine, ensure_engine, start_project_engine, stop_project_engine
from sao_harness.envs.gc import cleanup_run, list_runs
from sao_harness.envs.labels import RUN_KEY
from sao_harness.envs.sandbox import KIND_KEY
from sao_harness.harness.store import TraceStore
from sao_harness.harness.trace import INFRA_ERRORS, Status, Trajectory
from sao_harness.sao.config import load_config

TASKS = ["sao-harness__minicfg-8", "sao-harness__spanlib-8", "sao-harness__tablefmt-9"]
HEADER = "| fault | episodes affected | infra errors | retried | traces lost | recovered |"
FAULTS = ("engine_restart", "oom_kill", "disk_full", "worker_kill", "engine_kill", "hang")
MODES = ("rollout", "train")
TRAIN = ["trainer.batch_size=2", "trainer.max_steps=2", "trainer.save_every=1", "runtime.batch_timeout_s=300",
         "runtime.poll_interval_s=0.2"]
DISK_FS = "64m"
DELAY_S = 1.5  # seconds per reply of the rollout's own expert engine


# --- what a row says ----------------------------------------------------------------------------------


@dataclass
class Outcome:
    """One fault in one command: the table's row, and what the checks found."""

    fault: str
    mode: str
    affected: int = 0  # episodes in flight that the fault hit
    infra: int = 0  # infra errors recorded (rollout: final ones; train: every stored attempt)
    retried: int = 0  # attempts retried per rollout.max_retries
    lost: int = 0  # shards written before the fault that are gone or changed, plus shards that do not read back
    recovered: bool = False
    how: str = ""  # continued / stopped and resumed, and the counters
    problems: list[str] = field(default_factory=list)  # a check that failed (empty: the row holds)
    log: list[str] = field(default_factory=list)
    run_dir: Path | None = None
    tmp_root: Path | None = None  # a temporary run root of the bench's own, removed after the row

    def temp_root(self) -> Path:
        self.tmp_root = Path(tempfile.mkdtemp(prefix="sao-faults-"))
        return self.tmp_root

    def row(self) -> str:
        how = self.how.replace(str(self.run_dir), "<run>") if self.run_dir is not None else self.how
        rec = ("yes" if self.recovered and not self.problems else "NO") + (f": {how}" if how else "")
        return (f"| {self.fault.replace('_', ' ')} ({self.mode}) | {self.affected} | {self.infra} | {self.retried} "
                f"| {self.lost} | {rec} |")


def table(outcomes: list[Outcome]) -> str:
    return "\n".join([HEADER, "|---|---|---|---|---|---|", *(o.row() for o in outcomes)])


# --- the run's sandboxes, and a fault injected while they run -----------------------------------------


def run_sandboxes(client, run_name: str) -> list[dict]:
    """The running sandbox containers of the run named `run_name` (run ids `<run.name>-<time>[-<session>]`), as
    the engine lists them (one call: a container that ends meanwhile is simply not there)."""
    rows = client.api.containers(filters={"label": f"{KIND_KEY}=sandbox", "status": "running"})
    return [r for r in rows if (r.get("Labels") or {}).get(RUN_KEY, "").startswith(f"{run_name}-")]


class Missed(RuntimeError):
    """The fault found nothing to hit this time (its episode ended just then): the injector tries again."""


def _missed(e: BaseException) -> bool:
    import docker

    gone = ("stopped container", "not running", "is paused")
    return isinstance(e, (Missed, docker.errors.NotFound, ProcessLookupError, FileNotFoundError)) or (
        isinstance(e, docker.errors.APIError)  # not running any more: 409, or the runtime's 500
        and (e.status_code == 409 or any(g in str(e.explanation or e) for g in gone)))


class Injector(threading.Thread):
    """Calls `fault(sandboxes)` (docker-py containers, oldest first) once `need` sandboxes of the run have each
    been running for `settle_s` (their episode's agent has started); again at the next look if the fault
    missed (`Missed`, the container gone or stopped meanwhile)."""

    def __init__(self, run_name: str, fault: Callable[[list], object], need: int = 1, settle_s: float = 1.0,
                 timeout_s: float = 400.0):
        super().__init__(daemon=True, name=f"inject-{run_name}")
        self.run_name, self.fault, self.need, self.settle_s, self.timeout_s = run_name, fault, need, settle_s, timeout_s
        self.client = ensure_engine()
        self.victims: list[dict] = []  # the engine's rows of the sandboxes running when the fault hit
        self.t: float | None = None  # wall clock of the fault
        self.result = None
        self.error: BaseException | None = None
        self.looked = ""  # why the last look at the run's sandboxes failed, or the last miss
        self.before: dict[str, str] = {}  # shards already written when the fault hit -> their digest
        self.run_dir: Path | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        seen: dict[str, float] = {}  # container id -> when first seen running
        while not self._halt.is_set() and time.monotonic() < deadline:
            try:
                rows = run_sandboxes(self.client, self.run_name)
            except Exception as e:  # noqa: BLE001  (the engine restarting under another fault: look again)
                self.looked, rows = f"{type(e).__name__}: {e}", []
            now = time.monotonic()
            ready = sorted((r for r in rows if now - seen.setdefault(r["Id"], now) >= self.settle_s),
                           key=lambda r: seen[r["Id"]])
            if len(ready) >= self.need and self._inject(ready):
                return
            self._halt.wait(0.2)

    def _inject(self, rows: list[dict]) -> bool:
        import docker

        boxes = []
        for r in rows:
            try:
                boxes.append(self.client.containers.get(r["Id"]))
            except docker.errors.NotFound:
                pass
        if len(boxes) < self.need:
            return False
        before = digests(self.run_dir) if self.run_dir is not None else {}
        t = time.time()
        try:
            self.result = self.fault(boxes)
        except BaseException as e:  # noqa: BLE001  (a miss: look again; else reported by the row)
            if _missed(e):
                self.looked = f"missed: {type(e).__name__}: {e}"
                return False
            self.error = e
        self.victims, self.before, self.t = rows, before, t
        return True

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=120)

    def check(self, out: Outcome) -> None:
        if self.t is None:
            why = f"; {self.looked}" if self.looked else ""
            out.problems.append(f"the fault was never injected (no episode in flight{why})")
        if self.error is not None:
            out.problems.append(f"injecting the fault failed: {type(self.error).__name__}: {self.error}")


# --- the traces: nothing lost, nothing half-written ---------------------------------------------------


def digests(run_dir: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in TraceStore(run_dir).shards()}


def read_back(run_dir: Path) -> tuple[list[Trajectory], int]:
    """Every trajectory of every shard, read with pyarrow and with TraceStore; and how many shards did not read."""
    store, trajs, bad = TraceStore(run_dir), [], 0
    for shard in store.shards():
        try:
            rows = pq.read_table(shard).num_rows
            got = store.read_shard(shard)
            if len(got) != rows:
                raise ValueError(f"{len(got)} trajectories of {rows} rows")
            trajs.extend(got)
        except Exception:  # noqa: BLE001  (a half-written shard: counted as a lost trace)
            bad += 1
    return trajs, bad


def traces_lost(run_dir: Path, before: dict[str, str]) -> int:
    now = digests(run_dir)
    gone = sum(now.get(name) != digest for name, digest in before.items())
    return gone + read_back(run_dir)[1]


def check_rewards(trajs: list[Trajectory], out: Outcome) -> None:
    """An infra error has no reward; every other episode of the expert resolves (a 0 would be the fault)."""
    for t in trajs:
        if t.status == Status.INFRA_ERROR and t.reward is not None:
            out.problems.append(f"{t.traj_id}: infra_error with reward {t.reward}")
        elif t.status != Status.INFRA_ERROR and t.reward != 1.0:
            out.problems.append(f"{t.traj_id}: {t.status} reward {t.reward} ({t.metadata.get('infra_error', '')})")


def resolved_tasks(trajs: list[Trajectory]) -> set[str]:
    return {t.task_id for t in trajs if t.status == Status.OK and t.reward == 1.0}


# --- the two commands ---------------------------------------------------------------------------------


def overrides(root: Path, name: str, tasks: list[str], *extra: str) -> list[str]:
    return [f"run.root={root}", f"run.name={name}", "engine.kind=expert", "agent.profile=compact",
            f"tasks.instances=[{', '.join(tasks)}]", f"rollout.workers={min(len(tasks), 3)}",
            "sampling.max_tokens=4096", "agent.stuck_detection=false", f"model.cache_dir={ROOT / '.cache/sao'}",
            "rollout.max_retries=1", "sandbox.memory=512m", *extra]


def config(root: Path, name: str, tasks: list[str], *extra: str):
    return load_config(ROOT / "configs/local.yaml", overrides(root, name, tasks, *extra))


def start_policy(cfg, engine_cls=None, wrap=None):
    """The expert engine (or `engine_cls.from_config`, then `wrap(engine)`) and a started proxy, as
    `sao rollout` makes them."""
    from transformers import AutoTokenizer

    from sao_harness.harness.engines import make_engine
    from sao_harness.harness.proxy import ProxyServer
    from sao_harness.harness.tiny_model import resolve_model_path

    # each reply DELAY_S late: an episode's agent runs a few seconds, a fault lands in it even on an idle machine
    engine = (engine_cls.from_config(cfg, delay_s=DELAY_S) if engine_cls is not None
              else make_engine(cfg, delay_s=DELAY_S))
    if wrap is not None:
        engine = wrap(engine)
    proxy = ProxyServer(engine, AutoTokenizer.from_pretrained(resolve_model_path(cfg.model)), cfg)
    proxy.start(port=0)
    return engine, proxy


def rollout_case(fault: str, inject: Callable[[list], object], *, tasks=TASKS, extra=(), root: Path | None = None,
                 need: int = 2, engine_wrap=None, engine_cls=None, before_resume=None,
                 settle_s: float = 1.0) -> Outcome:
    """`sao rollout` with `inject(sandboxes)` while `need` episodes run; then the same rollout again (resume)."""
    from sao_harness.harness.rollout import run_rollout
    from sao_harness.harness.runner import load_tasks

    out = Outcome(fault, "rollout")
    root = root or out.temp_root()
    name = f"faults-{fault}-r{os.getpid()}-{int(time.time()) % 100000}"
    cfg = config(root, name, list(tasks), *extra)
    out.run_dir = cfg.run.dir
    loaded = load_tasks(cfg, "swe", log=out.log.append)  # as `sao rollout`: loaded and pre-flighted once
    engine, proxy = start_policy(cfg, engine_cls, engine_wrap)
    inj = Injector(name, inject, need=need, settle_s=settle_s)
    inj.run_dir = cfg.run.dir
    inj.start()
    stats, stopped = None, None
    try:
        stats = run_rollout(cfg, loaded, engine=engine, proxy=proxy, log=out.log.append)
    except Exception as e:  # noqa: BLE001  (a fault that stops the run: its message is the row's)
        stopped = f"{type(e).__name__}: {e}"
    finally:
        proxy.stop()
        engine.close()
        inj.stop()
    inj.check(out)
    out.affected = len(inj.victims)
    if stats is not None:
        out.infra, out.retried = stats.infra_errors, stats.retries
    out.lost = traces_lost(cfg.run.dir, inj.before)
    trajs, _ = read_back(cfg.run.dir)
    check_rewards(trajs, out)
    first = resolved_tasks(trajs)
    unstored = in_flight(inj) - {t.task_id for t in trajs}
    if before_resume is not None:
        before_resume()
    resumed = resume_rollout(cfg, tasks, out) if first != set(tasks) else ""
    out.recovered = resolved_tasks(read_back(cfg.run.dir)[0]) == set(tasks)
    head = f"stopped ({brief(stopped)})" if stopped else "continued"
    counts = f"{INFRA_ERRORS}={stats.infra_errors}, retries={stats.retries}" if stats is not None else ""
    out.how = f"{head}{'; ' + counts if counts else ''}{unstored_note(unstored)}{resumed}"
    return out


def brief(message: str) -> str:
    """A stop message as the table shows it: up to its first parenthesis, at most 160 characters."""
    return message.split(" (")[0][:160]


def in_flight(inj: Injector) -> set[str]:
    """The tasks of the episodes in flight when the fault hit (their sandboxes' task label)."""
    return {(r.get("Labels") or {}).get("sao-harness.task", "") for r in inj.victims} - {""}


def unstored_note(unstored: set[str]) -> str:
    return f"; {len(unstored)} in flight not stored (never half-written), run again by the resume" if unstored else ""


def resume_rollout(cfg, tasks, out: Outcome, tries: int = 2) -> str:
    """The same `sao rollout` again until every task is resolved (at most `tries` times: an episode of the rerun
    may meet an infra error of its own on a loaded machine); what the reruns did."""
    from sao_harness.harness.rollout import run_rollout
    from sao_harness.harness.runner import load_tasks

    runs = []
    while len(runs) < tries and resolved_tasks(read_back(cfg.run.dir)[0]) != set(tasks):
        kept = digests(cfg.run.dir)
        runs.append(run_rollout(cfg, load_tasks(cfg, "swe", log=out.log.append), log=out.log.append))  # a new run
        out.lost += traces_lost(cfg.run.dir, kept)
    check_rewards(read_back(cfg.run.dir)[0], out)
    if not runs:
        return ""
    extra = (f" (x{len(runs)}: {sum(r.infra_errors for r in runs)} infra error(s) of the reruns)"
             if len(runs) > 1 else "")
    return f"; resumed: {runs[0].done} rerun, {runs[0].skipped} kept{extra}"


def train_case(fault: str, inject: Callable[[list], object], *, tasks=TASKS[:2], extra=(), root: Path | None = None,
               need: int = 2, before_resume=None) -> Outcome:
    """`sao train` (real actors, B=2, 2 steps) with `inject(sandboxes)` while `need` episodes run; a run
    stopped by the fault is run again (it resumes from its checkpoint)."""
    from sao_harness.trainer.run.loop import train
    from sao_harness.trainer.run.ray_utils import LoopError

    out = Outcome(fault, "train")
    root = root or out.temp_root()
    name = f"faults-{fault}-t{os.getpid()}-{int(time.time()) % 100000}"
    cfg = config(root, name, list(tasks), *TRAIN, *extra)
    out.run_dir = cfg.run.dir
    inj = Injector(name, inject, need=need)
    inj.run_dir = cfg.run.dir
    inj.start()
    summary, stopped = None, None
    try:
        summary = train(cfg, log=out.log.append)
    except LoopError as e:
        stopped = str(e)
    except Exception as e:  # noqa: BLE001  (not a clear message: a problem of the row)
        stopped = f"{type(e).__name__}: {e}"
        out.problems.append(f"the run stopped without a clear message: {stopped}")
    finally:
        inj.stop()
    inj.check(out)
    out.affected = len(inj.victims)
    out.lost = traces_lost(cfg.run.dir, inj.before)
    trajs, _ = read_back(cfg.run.dir)
    check_rewards(trajs, out)
    first = summary
    if summary is None:
        if before_resume is not None:
            before_resume()
        kept = digests(cfg.run.dir)
        try:
            summary = train(cfg, log=out.log.append)
        except Exception as e:  # noqa: BLE001
            out.problems.append(f"the resumed run failed: {type(e).__name__}: {e}")
        out.lost += traces_lost(cfg.run.dir, kept)
        trajs, _ = read_back(cfg.run.dir)
        check_rewards(trajs, out)
    infra = [t for t in trajs if t.status == Status.INFRA_ERROR]
    out.infra = len(infra)
    out.retried = sum(not t.metadata.get("last_attempt", True) for t in infra)
    if summary is not None:
        from sao_harness.trainer.dist.checkpoint import latest_checkpoint, read_state

        state = read_state(latest_checkpoint(cfg.run.dir))
        by_id = {t.traj_id: t for t in trajs}
        trained = [by_id[i] for i in state["consumed"] if by_id[i].reward is not None]
        out.recovered = (state["step"] == 2 and state["policy_version"] == 2 and len(trained) == 4
                         and all(t.reward == 1.0 and t.status == Status.OK for t in trained))
        c = summary["counters"]
        counts = ", ".join(f"{k}={c[k]}" for k in (INFRA_ERRORS, "worker_deaths", "engine_deaths") if c.get(k))
        out.how = ("continued" if first is not None else f"stopped ({brief(stopped)}); resumed") + (
            f"; {counts}" if counts else "") + f"; step {state['step']}"
    return out


# --- the faults ---------------------------------------------------------------------------------------


def restart_engine(_boxes) -> float:
    """Stop the project dockerd (its containers die with it) and start it again; the seconds it was away."""
    cfg = DockerConfig()
    if ProjectEngine(cfg.state_dir).pid() is None:
        raise RuntimeError("the engine in use is not the project engine: not restarting it")
    t0 = time.monotonic()
    stop_project_engine(cfg)
    start_project_engine(cfg, log=lambda m: None)
    return time.monotonic() - t0


def engine_restart(mode: str) -> Outcome:
    case = rollout_case if mode == "rollout" else train_case
    return case("engine_restart", restart_engine)


def oom(boxes) -> dict:
    """A real OOM kill of one sandbox: its PID 1 first in the OOM killer's order, then a memory hog past the
    limit (the kernel kills PID 1, the container exits, the engine records OOMKilled). A sandbox that ends
    before the hog runs is a miss (`Missed`: the injector takes the next one)."""
    import docker

    box = boxes[-1]  # the youngest: its agent has the most left to do
    box.reload()
    Path(f"/proc/{box.attrs['State']['Pid']}/oom_score_adj").write_text("1000")
    box.exec_run(["tail", "/dev/zero"], detach=True)  # tail keeps its "last line": all of it
    deadline, state = time.monotonic() + 60, {}
    while time.monotonic() < deadline:
        try:
            state = box.client.api.inspect_container(box.id)["State"]
        except docker.errors.NotFound:  # the episode saw it die and removed it already
            return {"sandbox": box.name, "state": "removed after the kill"}
        if not state.get("Running"):
            break
        time.sleep(0.05)
    if not state.get("OOMKilled"):
        raise RuntimeError(f"sandbox {box.name} was not OOM-killed: {state}")
    return {"sandbox": box.name, "exit_code": state.get("ExitCode"), "oom_killed": True}


def oom_kill(mode: str) -> Outcome:
    case = rollout_case if mode == "rollout" else train_case
    out = case("oom_kill", oom)
    out.affected = 1  # one sandbox
    return out


@contextmanager
def small_fs(size: str = DISK_FS):
    """A tmpfs of `size` of its own (never the root disk), unmounted after."""
    mnt = Path(tempfile.mkdtemp(prefix="sao-faults-fs-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
        mnt.rmdir()


def fill(mnt: Path) -> Path:
    """Write a file on `mnt` until the filesystem refuses (ENOSPC); the file."""
    filler = mnt / "filler"
    chunk = b"\0" * (1 << 20)
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError:
            pass
        try:  # the last bytes, to the very end
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    return filler


def disk_full(mode: str) -> Outcome:
    with small_fs() as mnt:
        filler = mnt / "filler"
        free = lambda: filler.unlink(missing_ok=True)  # noqa: E731  (the operator frees space, then resumes)
        case = rollout_case if mode == "rollout" else train_case
        out = case("disk_full", lambda boxes: fill(mnt), root=mnt, before_resume=free)
        free()
    return out


def worker_kill(mode: str) -> Outcome:
    if mode == "rollout":
        return _kill_rollout_process()
    out = train_case("worker_kill", _kill_worker, need=2)
    out.affected = 1  # the killed worker's episode
    return out


def _kill_worker(_boxes) -> dict:
    """SIGKILL the process of a rollout worker (Ray actor) that runs an episode now."""
    import ray

    for name in sorted(ray.util.list_named_actors()):
        if not name.startswith("sao-worker-"):
            continue
        status = ray.get(ray.get_actor(name).status.remote(), timeout=30)
        if status["current"]:
            os.kill(status["pid"], signal.SIGKILL)
            return {"worker": name, "pid": status["pid"], "episode": status["current"]}
    raise Missed("no rollout worker runs an episode")


def _kill_rollout_process() -> Outcome:
    """`sao rollout` runs its episodes in threads of one process: SIGKILL that process mid-episode; the same
    command again resumes (its sandboxes are left to `sao docker gc`: removed here by run id)."""

    out = Outcome("worker_kill", "rollout")
    root = out.temp_root()
    name = f"faults-worker_kill-r{os.getpid()}-{int(time.time()) % 100000}"
    cfg = config(root, name, TASKS)
    proc = subprocess.Popen([sys.executable, "-m", "sao_harness.sao.cli", "rollout", "--config",
                             str(ROOT / "configs/local.yaml"), *overrides(root, name, TASKS)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    inj = Injector(name, lambda boxes: os.kill(proc.pid, signal.SIGKILL), need=2)
    inj.run_dir = cfg.run.dir
    inj.start()
    text, _ = proc.communicate(timeout=600)
    inj.stop()
    out.log.extend(text.splitlines())
    inj.check(out)
    out.affected = len(inj.victims)
    if proc.returncode != -signal.SIGKILL:
        out.problems.append(f"sao rollout ended with {proc.returncode}, not killed")
    client = ensure_engine()
    left = {rid: info for rid, info in list_runs(client).items() if rid.startswith(f"{name}-")}
    n_left = sum(len(info.containers) for info in left.values())
    for rid in left:  # the killed process's sandboxes (its owner is dead: `sao docker gc` removes them too)
        cleanup_run(rid, client)
    out.lost = traces_lost(cfg.run.dir, inj.before)
    before = read_back(cfg.run.dir)[0]
    check_rewards(before, out)
    unstored = in_flight(inj) - {t.task_id for t in before}
    resumed = resume_rollout(cfg, TASKS, out)
    out.recovered = resolved_tasks(read_back(cfg.run.dir)[0]) == set(TASKS)
    out.how = (f"killed (exit {proc.returncode}), {n_left} container(s) left for gc{unstored_note(unstored)}"
               f"{resumed}")
    return out


class _Dying:
    """The rollout's engine, which dies once armed (`kill()`) and one more request served: every later request
    fails (EngineError). Armed as the sandboxes start, it dies in the middle of the episodes in flight."""

    def __init__(self, engine):
        self._engine, self.left = engine, None  # requests it still serves once armed
        self._lock = threading.Lock()

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def kill(self) -> None:
        self.left = 1

    def generate(self, prompt_ids, sampling, timeout=None):
        from sao_harness.harness.engines import EngineError

        with self._lock:
            if self.left is not None:
                if self.left <= 0:
                    raise EngineError("the engine died (bench_faults: engine replica kill)")
                self.left -= 1
        return self._engine.generate(prompt_ids, sampling, timeout)


def engine_kill(mode: str) -> Outcome:
    if mode == "train":
        return train_case("engine_kill", _kill_replica)
    holder: dict = {}

    def wrap(engine):
        holder["engine"] = _Dying(engine)
        return holder["engine"]

    return rollout_case("engine_kill", lambda boxes: holder["engine"].kill(), engine_wrap=wrap, settle_s=0.0)


def _kill_replica(_boxes) -> dict:
    """SIGKILL the process of the engine replica (its proxy dies with it)."""
    import ray

    names = [n for n in ray.util.list_named_actors() if n.startswith("sao-engine-")]
    if not names:
        raise RuntimeError("no engine replica")
    actor = ray.get_actor(sorted(names)[0])
    pid = ray.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=30)
    os.kill(pid, signal.SIGKILL)
    return {"replica": sorted(names)[0], "pid": pid}


def hang(mode: str) -> Outcome:
    if mode == "train":  # every process of one sandbox stopped (the freezer: docker pause)
        out = train_case("hang", lambda boxes: boxes[-1].pause(), need=2)
        out.affected = 1
        return out
    from sao_harness.harness.engines.expert import ExpertEngine
    from sao_harness.harness.engines.scripted_policy import call

    victim = TASKS[0]

    class SleepFirst(ExpertEngine):  # the victim's first call hangs: sleep 100000 under max_command_s=5
        def plan(self, task_id):
            replies = super().plan(task_id)
            if task_id == victim and replies[0].calls[0][0] != "terminal":
                replies.insert(0, call("terminal", {"command": "sleep 100000"}))
            return replies

    out = rollout_case("hang", lambda boxes: None, engine_cls=SleepFirst, need=1, extra=("agent.max_command_s=5",))
    out.affected = 1
    from transformers import AutoTokenizer

    from sao_harness.harness.tiny_model import ensure_tiny_model

    tok = AutoTokenizer.from_pretrained(ensure_tiny_model(ROOT / ".cache/sao"))
    [traj] = [t for t in read_back(out.run_dir)[0] if t.task_id == victim]
    seen = "".join(tok.decode(s.token_ids) for s in traj.segments if s.kind != "action")
    if "sleep 100000" not in "".join(tok.decode(s.token_ids) for s in traj.segments) or \
            "The sandbox stopped this command" not in seen:
        out.problems.append(f"{traj.traj_id}: the hung command was not stopped at agent.max_command_s")
    out.how += "; the sleep was stopped at 5 s, the episode went on"
    return out


def run_fault(fault: str, mode: str) -> Outcome:
    """The row of `fault` (one of FAULTS) in `mode` (rollout, train); its run directory is removed after, unless
    $SAO_FAULTS_KEEP is set."""
    out = globals()[fault](mode)
    if out.tmp_root is not None and not os.environ.get("SAO_FAULTS_KEEP"):
        shutil.rmtree(out.tmp_root, ignore_errors=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=",".join(FAULTS), help=f"comma-separated faults of {', '.join(FAULTS)}")
    p.add_argument("--mode", choices=[*MODES, "both"], default="both")
    args = p.parse_args(argv)
    from sao_harness.harness.agent import load_sdk
    from sao_harness.trainer.run.ray_utils import start_ray

    ensure_engine()
    load_sdk()
    modes = MODES if args.mode == "both" else (args.mode,)
    if "train" in modes:
        start_ray(None, log=lambda m: None)  # one Ray session for every `sao train` here
    outcomes = []
    for fault in args.only.split(","):
        for mode in modes:
            t0 = time.monotonic()
            o = run_fault(fault, mode)
            outcomes.append(o)
            print(f"{fault} ({mode}): {time.monotonic() - t0:.0f} s; {o.row()}", flush=True)
            for problem in o.problems:
                print(f"  problem: {problem}", flush=True)
    print(table(outcomes))
    return 0 if all(o.recovered and not o.problems and o.lost == 0 for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
