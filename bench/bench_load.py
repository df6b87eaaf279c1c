"""Load on one node: N concurrent real episodes (bundled tasks, compact agent, Docker sandboxes, real grader).

Run: ``.venv/bin/python bench/bench_load.py [--n 16,32,64,128]``. The policy is the scripted gold policy
(``ScriptedPolicyEngine.gold``: ~0 s a turn), so every figure is the harness's, the engine's and the
grader's own cost. Per N: ``rollout.workers = N`` and N episodes (bundled tasks, each
``rollout.episodes_per_task`` times), ``rollout.max_retries = 0`` (every infra error shows). Figures:
- the wait for a sandbox start slot p50 / p99 (``sandbox.start_slots``: ``--start-slots n,0`` runs each N
  without a bound, then with the default, for a before/after in one run);
- sandbox start p50 / p99: container create -> its shell answers the first command (the episode's
  ``sandbox_start_s``); p99 of its shell's part (bounded by ``sandbox.start_timeout_s``) and of the agent's
  terminal start (``docker exec -it``, ``tools_start_s``; bounded by ``SHELL_START_TIMEOUT_S``);
- episodes per minute (first episode start to last end), the median episode (its agent part, its wait
  for a grading slot: ``grading.node_slots``, and its grading), infra errors (count, kinds: harness.infra);
- peak memory per sandbox (its cgroup's peak, page cache included), p50 and max over the run's sandboxes;
  the same per grading container (label ``sao-harness.owner=grade``: every run's on the engine, other
  processes' too), the most containers of each at once, the host's memory in use (the largest drop
  of MemAvailable from the run's start: every process, the training job beside it too) and the rollout
  process's peak RSS;
- CPU in cores (CPU seconds / wall seconds): the host's, the rollout process's, dockerd's, containerd's;
- the rollout process's peak open file descriptors (``/proc/self/fd``, sampled).
The last line is ``load: N concurrent, start p50 A s p99 B s, C episodes/min, D infra errors, E MiB per
sandbox`` for the largest N.
"""
from __future__ import annotations

import argparse
import math
import os
import secrets
import statistics
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from _common import ROOT

from sao_harness.envs.config import DockerConfig
from sao_harness.envs.engine import ProjectEngine, ensure_engine
from sao_harness.envs.shell import PersistentShell
from sao_harness.harness.engines.scripted_policy import ScriptedPolicyEngine
from sao_harness.harness.infra import kind_of
from sao_harness.harness.proxy import ProxyServer
from sao_harness.harness.rollout import run_rollout
from sao_harness.harness.runner import load_tasks as run_tasks
from sao_harness.harness.store import TraceStore
from sao_harness.harness.tiny_model import ensure_tiny_model
from sao_harness.harness.trace import Status
from sao_harness.sao.config import load_config
from sao_harness.tasks.formats.loaders import load_tasks

SAMPLE_S = 0.25  # between two samples of fds and sandbox memory
MIB = 1024 * 1024


# -------------------------------------------------------------------------------------- plan

def plan(n: int, n_tasks: int) -> tuple[int, int]:
    """``(tasks, episodes per task)`` with tasks * episodes = ``n`` and tasks <= ``n_tasks`` (fewest repeats);
    no exact split: ceil(n / n_tasks) episodes of each task, a few more than ``n``."""
    for per in range(1, n + 1):
        if n % per == 0 and n // per <= n_tasks:
            return n // per, per
    per = math.ceil(n / n_tasks)
    return math.ceil(n / per), per


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


# ----------------------------------------------------------------------------------- sampling

def cpu_seconds(pid: int | None) -> float:
    """utime + stime of ``pid`` (0.0 when it is gone or None)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def host_busy_seconds() -> float:
    """CPU seconds the host spent busy since boot, all cores (``/proc/stat``: everything but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


class ShellTimer:
    """Times each sandbox shell's start (``PersistentShell.__init__``: its exec up to the first command answered),
    the part of a start that ``sandbox.start_timeout_s`` bounds; patched in while the timer is entered."""

    def __init__(self):
        self.seconds: list[float] = []

    def __enter__(self) -> ShellTimer:
        self.original = init = PersistentShell.__init__

        def timed(shell, *args, **kwargs):
            t0 = time.monotonic()
            init(shell, *args, **kwargs)
            self.seconds.append(time.monotonic() - t0)

        PersistentShell.__init__ = timed
        return self

    def __exit__(self, *exc) -> None:
        PersistentShell.__init__ = self.original


def engine_pids() -> dict[str, int | None]:
    """The pids of ``dockerd`` (the project engine's, else the first one running) and of its ``containerd``."""
    pids: dict[str, int | None] = {"dockerd": ProjectEngine(DockerConfig().state_dir).pid(), "containerd": None}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            comm = (proc / "comm").read_text().strip()
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if comm == "dockerd" and pids["dockerd"] is None:
            pids["dockerd"] = int(proc.name)
        elif comm == "containerd" and (pids["containerd"] is None or ppid == pids["dockerd"]):
            pids["containerd"] = int(proc.name)
    return pids


def peak_file(pid: int) -> Path | None:
    """The memory-peak file of the cgroup of process ``pid`` (a container's init): cgroup v1
    ``memory.max_usage_in_bytes``, v2 ``memory.peak``; None when neither is readable."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            candidate = Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.max_usage_in_bytes"
        elif controllers == "":
            candidate = Path("/sys/fs/cgroup") / path.lstrip("/") / "memory.peak"
        else:
            continue
        if candidate.is_file():
            return candidate
    return None


def meminfo_kib(key: str, path: str = "/proc/meminfo") -> int:
    """A ``key: N kB`` value of ``/proc/meminfo`` (or of a ``/proc/<pid>/status``), in KiB; 0 when absent."""
    for line in Path(path).read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


class Sampler(threading.Thread):
    """Every ``SAMPLE_S``: this process's open fds and RSS, the host's available memory, and the memory peak of
    each sandbox (a container named ``prefix*``) and grading container (label ``sao-harness.owner=grade``)."""

    def __init__(self, client, prefix: str):
        super().__init__(name="bench-load-sampler", daemon=True)
        self.api, self.prefix = client.api, prefix
        self.peak_fds = self.peak_rss_kib = 0
        self.at_once = {"sandbox": 0, "grade": 0}  # the most containers of each kind at once
        self.available0 = self.available_min = meminfo_kib("MemAvailable")
        self.peaks: dict[str, dict[str, int]] = {"sandbox": {}, "grade": {}}  # kind -> id -> peak bytes read
        self.files: dict[str, Path | None] = {}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(SAMPLE_S):
            self.sample()

    def sample(self) -> None:
        self.peak_fds = max(self.peak_fds, len(os.listdir("/proc/self/fd")))
        self.peak_rss_kib = max(self.peak_rss_kib, meminfo_kib("VmRSS", "/proc/self/status"))
        self.available_min = min(self.available_min, meminfo_kib("MemAvailable"))
        try:
            kinds = {"sandbox": [c["Id"] for c in self.api.containers(filters={"name": self.prefix})],
                     "grade": [c["Id"] for c in self.api.containers(filters={"label": "sao-harness.owner=grade"})]}
        except Exception:  # noqa: BLE001  (a busy engine: the next sample)
            return
        for kind, ids in kinds.items():
            self.at_once[kind] = max(self.at_once[kind], len(ids))
            for cid in ids:
                self._read(kind, cid)

    def _read(self, kind: str, cid: str) -> None:
        if cid not in self.files:
            self.files[cid] = self._file(cid)
        try:
            if self.files[cid] is not None:
                self.peaks[kind][cid] = max(self.peaks[kind].get(cid, 0), int(self.files[cid].read_text()))
        except (OSError, ValueError):  # removed between the list and the read
            pass

    def _file(self, cid: str) -> Path | None:
        try:
            pid = self.api.inspect_container(cid)["State"].get("Pid") or 0
        except Exception:  # noqa: BLE001
            return None
        return peak_file(pid) if pid else None

    def mib(self, kind: str) -> list[float]:
        return [b / MIB for b in self.peaks[kind].values()]

    def stop(self) -> None:
        self.sample()
        self.done.set()
        self.join(timeout=10)


# ---------------------------------------------------------------------------------------- run

def infra_kind(metadata: dict) -> str:
    """An infra error's kind (harness.infra.kind_of) and what its reason opens with, e.g.
    ``docker_engine (EngineGone)``."""
    head = str(metadata.get(Status.INFRA_ERROR, "")).partition(":")[0].strip()
    return f"{kind_of(metadata)} ({head[:60]})"


def run_n(n: int, tasks, tokenizer, tmp: str, start_slots: int = 0) -> dict:
    """One load run of ``n`` concurrent episodes with ``sandbox.start_slots = start_slots``; its figures."""
    count, per = plan(n, len(tasks))
    chosen = tasks[:count]
    name = f"load-n{n}-{secrets.token_hex(3)}"
    cfg = load_config(ROOT / "configs/local.yaml", [
        f"run.root={tmp}", f"run.name={name}", f"model.cache_dir={ROOT / '.cache/sao'}",
        "sampling.max_tokens=4096", "proxy.context_budget=32768", "agent.profile=compact",
        "agent.stuck_detection=false", f"tasks.instances=[{', '.join(t.instance_id for t in chosen)}]",
        f"rollout.workers={n}", f"rollout.episodes_per_task={per}", "rollout.max_retries=0",
        "rollout.max_infra_frac=null",  # a load run reports every infra error, it does not stop on them
        f"sandbox.start_slots={start_slots}"])
    engine = ScriptedPolicyEngine.gold(tokenizer, chosen)
    loaded = run_tasks(cfg, "swe", log=lambda *_: None)  # as `sao rollout`: loaded and pre-flighted once
    proxy = ProxyServer(engine, tokenizer, cfg)
    proxy.start(port=0)
    sampler = Sampler(ensure_engine(cfg.docker), f"sao-{name}-")
    pids = engine_pids()
    pids["rollout"], pids["host"] = os.getpid(), None
    cpu0 = {k: cpu_seconds(p) for k, p in pids.items()} | {"host": host_busy_seconds()}
    t0 = time.monotonic()
    sampler.start()
    try:
        with ShellTimer() as shells:
            run_rollout(cfg, loaded, engine=engine, proxy=proxy, log=lambda *_: None)
    finally:
        wall = time.monotonic() - t0
        sampler.stop()
        proxy.stop()
    cpu = {k: (cpu_seconds(p) - cpu0[k]) / wall for k, p in pids.items()}
    cpu["host"] = (host_busy_seconds() - cpu0["host"]) / wall
    return figures(n, list(TraceStore(cfg.run.dir)), sampler, cpu, shells.seconds) | {"slots": cfg.sandbox.slots()}


def median_timing(trajs, key: str) -> float:
    values = [t.timings[key] for t in trajs if key in t.timings]
    return statistics.median(values) if values else math.nan


def figures(n: int, trajs, sampler: Sampler, cpu: dict[str, float], shells: list[float]) -> dict:
    """The row of one run from its trajectories, samples, CPU (cores) and sandbox shell starts."""
    starts = [t.timings["sandbox_start_s"] for t in trajs if "sandbox_start_s" in t.timings]
    waits = [t.timings["sandbox_wait_s"] for t in trajs if "sandbox_wait_s" in t.timings]
    terminal = [t.metadata["agent"].get("tools_start_s", math.nan) for t in trajs if "agent" in t.metadata]
    span = max(t.metadata["t_end"] for t in trajs) - min(t.metadata["t_start"] for t in trajs)
    failed = [t for t in trajs if t.status == Status.INFRA_ERROR]
    infra = Counter(infra_kind(t.metadata) for t in failed)
    reasons = {infra_kind(t.metadata): str(t.metadata.get(Status.INFRA_ERROR, ""))[:400] for t in failed}
    peaks, grading = sampler.mib("sandbox"), sampler.mib("grade")
    return dict(n=n, episodes=len(trajs), resolved=sum(t.reward == 1.0 for t in trajs), span=span,
                per_min=len(trajs) / span * 60, start50=percentile(starts, 50), start99=percentile(starts, 99),
                wait_start50=percentile(waits, 50), wait_start99=percentile(waits, 99),
                shell99=percentile(shells, 99), term99=percentile(terminal, 99),
                episode50=median_timing(trajs, "episode_s"), agent50=median_timing(trajs, "agent_s"),
                wait50=median_timing(trajs, "grade_wait_s"), grade50=median_timing(trajs, "grade_s"),
                infra=sum(infra.values()), kinds=dict(infra), reasons=reasons, mem50=percentile(peaks, 50),
                mem_max=max(peaks, default=math.nan), sandboxes=len(peaks), gmem50=percentile(grading, 50),
                gmem_max=max(grading, default=math.nan), at_once=sampler.at_once,
                host=(sampler.available0 - sampler.available_min) / 1024, rss=sampler.peak_rss_kib / 1024,
                cpu=cpu, fds=sampler.peak_fds)


HEADER = ("| N | start slots | episodes | resolved | span s | episodes/min | start wait p50 / p99 s "
          "| start p50 / p99 s | shell p99 s | terminal p99 s "
          "| episode p50 s (agent / grade wait / grade) | infra errors | MiB/sandbox p50 (max) "
          "| MiB/grading ctr p50 (max) "
          "| sandboxes / grading ctrs at once | host MiB used | rollout RSS MiB "
          "| CPU cores: host / rollout / dockerd / containerd | peak fds |")


def row(r: dict) -> str:
    cpu = " / ".join(f"{r['cpu'][k]:.2f}" for k in ("host", "rollout", "dockerd", "containerd"))
    return (f"| {r['n']} | {r['slots']} | {r['episodes']} | {r['resolved']} | {r['span']:.0f} | {r['per_min']:.1f} "
            f"| {r['wait_start50']:.2f} / {r['wait_start99']:.2f} | {r['start50']:.2f} / {r['start99']:.2f} "
            f"| {r['shell99']:.2f} | {r['term99']:.2f} "
            f"| {r['episode50']:.1f} ({r['agent50']:.1f} / {r['wait50']:.1f} / {r['grade50']:.1f}) | {r['infra']} "
            f"| {r['mem50']:.0f} ({r['mem_max']:.0f}) | {r['gmem50']:.0f} ({r['gmem_max']:.0f}) "
            f"| {r['at_once']['sandbox']} / {r['at_once']['grade']} "
            f"| {r['host']:.0f} | {r['rss']:.0f} | {cpu} | {r['fds']} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="16,32,64,128", help="concurrent episodes, a comma-separated list")
    ap.add_argument("--start-slots", default="0", help="sandbox.start_slots per N, a comma-separated list run "
                    "in order (0: the default, four per core; n: N, no bound), e.g. n,0 for before/after")
    args = ap.parse_args()
    ns = [int(x) for x in args.n.split(",") if x.strip()]
    from transformers import AutoTokenizer

    from sao_harness.harness.agent import load_sdk

    ensure_engine()
    load_sdk()  # the SDK import (~6 s) is once per process: keep it out of the first run
    tokenizer = AutoTokenizer.from_pretrained(ensure_tiny_model(ROOT / ".cache/sao"))
    tasks = load_tasks("bundled")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n, slots in [(n, n if s == "n" else int(s)) for n in ns for s in args.start_slots.split(",")]:
            rows.append(run_n(n, tasks, tokenizer, tmp, slots))
            print(f"N={n}, start slots {rows[-1]['slots']}: {rows[-1]['episodes']} episodes, "
                  f"{rows[-1]['sandboxes']} sandboxes sampled, infra error kinds {rows[-1]['kinds'] or '-'}",
                  flush=True)
            for kind, reason in rows[-1]["reasons"].items():
                print(f"  {kind}, e.g.: {reason}", flush=True)
    print()
    print(HEADER)
    print("|" + "---|" * HEADER.count(" | ") + "---|")
    for r in rows:
        print(row(r))
    last = rows[-1]
    print(f"load: {last['n']} concurrent, start p50 {last['start50']:.2f} s p99 {last['start99']:.2f} s, "
          f"{last['per_min']:.1f} episodes/min, {last['infra']} infra errors, {last['mem50']:.0f} MiB per sandbox")


if __name__ == "__main__":
    main()
