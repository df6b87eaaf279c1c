"""Images without a registry: the debootstrap base image and offline wheel installs.

- ``ensure_base_image(client, cfg)``: ``docker.base_image`` when set (local, else pulled); otherwise
  ``sao-harness/base:<hash12>``, where the hash covers the recipe (suite, packages, files, image
  config). Found locally -> returned at once; else loaded from ``<image_cache_dir>/<name>.tar.gz``
  when present; else built: debootstrap (minbase + packages, from the host apt's mirror) into a
  directory under the state dir, trimmed, imported with ``docker import``, saved to the cache.
- ``build_image_with_wheels(base, packages, tag)``: wheels downloaded on the host
  (``pip download --only-binary=:all:`` for CPython 3.11 manylinux), installed offline in a
  ``--network none`` classic build. Nothing inside a container ever uses the network.
"""
from __future__ import annotations

import fcntl
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from sao_harness.core.files import atomic_write
from sao_harness.envs.config import DockerConfig
from sao_harness.envs.engine import docker_client
from sao_harness.envs.errors import ImageBuildError, ImageNotFound
from sao_harness.envs.hostpkg import ensure_programs
from sao_harness.envs.labels import OWNER_VALUE, run_labels
from sao_harness.envs.mirror import debian_mirror

# Images get their own label key: containers inherit image labels, and a container must carry
# ``sao-harness.owner`` only when our code made it (with its run labels).
IMAGE_LABEL = "sao-harness.built-by"
BASE_REPO = "sao-harness/base"
WHEELS_REPO = "sao-harness/wheels"
BASE_PACKAGES = ("python3", "python3-venv", "python3-pytest", "python-is-python3", "git", "patch",
                 "ca-certificates", "procps")
# Trimmed after debootstrap: docs, caches, apt lists (the image never runs apt against the network).
TRIM = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "var/cache/apt",
        "var/lib/apt/lists", "var/log")
FILES = {
    # git in any container, whoever owns the checkout; a fixed identity for commits made in setup.
    "etc/gitconfig": "[safe]\n\tdirectory = *\n[user]\n\tname = sao-harness\n\temail = sao-harness@localhost\n"
                     "[init]\n\tdefaultBranch = main\n[advice]\n\tdetachedHead = false\n",
}
CHANGES = ("ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "ENV LANG=C.UTF-8",
           "ENV PYTHONDONTWRITEBYTECODE=1", 'CMD ["/bin/bash"]')
# (`docker import` accepts no STOPSIGNAL on engine 20.10: sandboxes run with --init and stop signal SIGKILL.)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def base_recipe(cfg: DockerConfig) -> dict:
    """Everything that decides the base image's content (the mirror does not: same suite, same packages)."""
    return {"recipe": 1, "label": IMAGE_LABEL, "suite": cfg.suite, "variant": "minbase",
            "packages": list(BASE_PACKAGES), "trim": list(TRIM), "files": FILES, "changes": list(CHANGES)}


def recipe_hash(recipe: dict) -> str:
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def base_tag(cfg: DockerConfig) -> str:
    """The image name the base image has (``docker.base_image`` or the recipe-hash tag)."""
    return cfg.base_image or f"{BASE_REPO}:{recipe_hash(base_recipe(cfg))}"


def image_exists(client, name: str) -> bool:
    """Whether the engine of ``client`` holds the image ``name`` (no registry is asked)."""
    import docker  # lazy: docker-py is heavy (it pulls in requests)

    try:
        client.images.get(name)
        return True
    except docker.errors.ImageNotFound:
        return False


def read_image_file(client, image: str, path: str) -> str | None:
    """Text of the file ``path`` in ``image`` (None when it is not a file there), through a container that
    is created and never started (the archive API: no output to lose, unlike a short ``run``)."""
    import docker  # lazy: docker-py's errors, next to the client

    cid = client.api.create_container(image, command=["true"], network_disabled=True,
                                      labels=run_labels(**{"sao-harness.kind": "image-read"}))["Id"]
    try:
        stream, _ = client.api.get_archive(cid, path)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.next()
            f = tar.extractfile(member) if member is not None and member.isfile() else None
            return f.read().decode(errors="replace") if f is not None else None
    except docker.errors.NotFound:
        return None
    finally:
        client.api.remove_container(cid, force=True)


def require_image(client, name: str) -> None:
    """``ImageNotFound`` naming ``name`` unless it exists locally."""
    if not image_exists(client, name):
        raise ImageNotFound(name)


def _cache_file(cfg: DockerConfig, tag: str) -> Path | None:
    if cfg.image_cache_dir is None:
        return None
    return Path(cfg.image_cache_dir) / (re.sub(r"[^A-Za-z0-9_.-]", "_", tag) + ".tar.gz")


@contextmanager
def _lock(cfg: DockerConfig, name: str):
    d = Path(cfg.state_dir)
    try:
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"{name}.lock"
        f = open(path, "w")
    except OSError:
        f = open(Path(tempfile.gettempdir()) / f"sao-harness-{name}.lock", "w")
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def ensure_base_image(client, cfg: DockerConfig, *, log=_log) -> str:
    """Name of a local base image, building (or loading / pulling) it only when missing."""
    import docker  # lazy: docker-py is heavy (it pulls in requests)

    if cfg.base_image:
        if not image_exists(client, cfg.base_image):
            log(f"base: pulling {cfg.base_image}")
            try:
                client.images.pull(cfg.base_image)
            except docker.errors.APIError as e:
                raise ImageNotFound(cfg.base_image) from e
        return cfg.base_image
    tag = base_tag(cfg)
    if image_exists(client, tag):
        return tag
    with _lock(cfg, "base"):
        if image_exists(client, tag):  # built by another process meanwhile
            return tag
        cache = _cache_file(cfg, tag)
        if cache is not None and cache.is_file():
            log(f"base: loading {tag} from {cache}")
            t0 = time.monotonic()
            try:
                load_image_file(client, cache)
            except Exception as e:  # a corrupt cache is rebuilt, not fatal
                log(f"base: cache {cache} unusable ({e}); rebuilding")
            if image_exists(client, tag):
                log(f"base: loaded {tag} in {time.monotonic() - t0:.1f} s")
                return tag
        build_base_image(client, cfg, tag, log=log)
        if cache is not None:
            log(f"base: saving {tag} to {cache}")
            save_image_file(client, tag, cache)
    return tag


def build_base_image(client, cfg: DockerConfig, tag: str, *, log=_log) -> None:
    """debootstrap -> trim -> docker import (see module doc). Root only."""
    if os.geteuid() != 0:
        raise ImageBuildError("building the base image needs root (debootstrap); run `sudo .venv/bin/sao "
                              "docker base`, or set docker.base_image to an image you already have")
    ensure_programs({"debootstrap": "debootstrap"}, log=log)
    recipe = base_recipe(cfg)
    mirror, keyring = debian_mirror(cfg.suite, cfg.mirror)
    root = Path(cfg.state_dir) / f"rootfs-{recipe_hash(recipe)}"
    if root.exists():
        shutil.rmtree(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    log(f"base: building {tag}: debootstrap {cfg.suite} minbase + {len(BASE_PACKAGES)} packages from {mirror} "
        f"(~1-2 min)")
    argv = ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}"]
    argv += [f"--keyring={keyring}"] if keyring else ["--no-check-gpg"]
    argv += [cfg.suite, str(root), mirror]
    try:
        _run_debootstrap(argv, root, log)
        log(f"base: debootstrap done in {time.monotonic() - t0:.0f} s; trimming")
        _trim(root)
        t1 = time.monotonic()
        log(f"base: importing into Docker as {tag}")
        import_rootfs(client, root, tag)
        log(f"base: imported in {time.monotonic() - t1:.0f} s; {tag} ready after {time.monotonic() - t0:.0f} s")
    finally:
        shutil.rmtree(root, ignore_errors=True)


_PER_PACKAGE = re.compile(r"^I: (Retrieving|Validating|Extracting|Unpacking|Configuring) ")


def _run_debootstrap(argv: list[str], root: Path, log) -> None:
    """Run debootstrap, printing its phases (per-package lines are summarized every few seconds)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                            env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    tail: list[str] = []
    last_print = 0.0
    count = 0
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        tail = (tail + [line])[-20:]
        if _PER_PACKAGE.match(line):
            count += 1
            if time.monotonic() - last_print > 5:
                log(f"  debootstrap: {line[3:]} ({count} steps)")
                last_print = time.monotonic()
        elif line.startswith(("I:", "W:", "E:")):
            log(f"  debootstrap: {line[3:]}")
    if proc.wait() != 0:
        debootstrap_log = root / "debootstrap" / "debootstrap.log"
        extra = ""
        if debootstrap_log.is_file():
            extra = "\n" + "\n".join(debootstrap_log.read_text(errors="replace").splitlines()[-15:])
        raise ImageBuildError(f"debootstrap failed (exit {proc.returncode}):\n" + "\n".join(tail) + extra)


def _trim(root: Path) -> None:
    for rel in TRIM:
        d = root / rel
        if d.is_dir():
            for child in d.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
    (root / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
    (root / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def import_rootfs(client, root: Path, tag: str, changes=CHANGES) -> None:
    """``tar -C root -c . | docker import --change ... - tag``, streamed (no temporary tarball)."""
    repo, _, version = tag.rpartition(":")
    tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(root), "-cf", "-", "."],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert tar.stdout is not None
    chunks = iter(lambda: tar.stdout.read(1 << 20), b"")
    try:
        result = client.api.import_image(src=chunks, repository=repo, tag=version,
                                         changes=list(changes) + [f"LABEL {IMAGE_LABEL}={OWNER_VALUE}"])
    except Exception as e:
        tar.kill()
        raise ImageBuildError(f"docker import of {root} failed: {getattr(e, 'explanation', None) or e}") from e
    finally:
        tar.stdout.close()
    err = tar.stderr.read().decode(errors="replace") if tar.stderr else ""
    if tar.wait() != 0:
        raise ImageBuildError(f"tar of {root} failed: {err.strip()[-500:]}")
    if "error" in str(result).lower() and not image_exists(client, tag):
        raise ImageBuildError(f"docker import failed: {str(result)[:500]}")


def save_image_file(client, tag: str, path: Path) -> None:
    """``docker save tag | gzip -1 > path``, written to a temporary name and renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    def write(raw):
        with gzip.open(raw, "wb", compresslevel=1) as out:
            for chunk in client.images.get(tag).save(chunk_size=1 << 20, named=True):
                out.write(chunk)

    atomic_write(path, write)


def load_image_file(client, path: Path) -> None:
    """``docker load < path`` (gzip accepted); raises on an engine-reported error."""
    with open(path, "rb") as f:
        for msg in client.api.load_image(iter(lambda: f.read(1 << 20), b"")):
            if isinstance(msg, dict) and msg.get("error"):
                raise ImageBuildError(f"docker load {path}: {msg['error']}")


def wheels_tag(base: str, packages: list[str], python_version: str = "3.11") -> str:
    h = hashlib.sha256(json.dumps([base, sorted(packages), python_version]).encode()).hexdigest()[:12]
    return f"{WHEELS_REPO}:{h}"


def download_wheels(packages: list[str], dest: Path, python_version: str = "3.11", *, log=_log) -> list[Path]:
    """``pip download`` binary wheels of ``packages`` (+ pip itself) for CPython ``python_version``."""
    dest.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--only-binary=:all:",
            "--python-version", python_version, "--implementation", "cp",
            "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_36_x86_64",
            "--dest", str(dest), "pip", *packages]
    log(f"wheels: pip download {' '.join(packages)} (python {python_version})")
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.strip().splitlines()[-12:])
        raise ImageBuildError(f"pip download {' '.join(packages)} failed (exit {proc.returncode}):\n{tail}")
    return sorted(dest.glob("*.whl"))


def build_image_with_wheels(base: str, packages: list[str], tag: str | None = None, *, client=None,
                            python_version: str = "3.11", log=_log, force: bool = False) -> str:
    """Image ``tag`` = ``base`` + ``packages`` installed offline from host-downloaded wheels.

    The build runs with ``network_mode=none``, the classic builder (the API's default; no
    heredocs) and ``forcerm``. An existing ``tag`` is reused unless ``force``. Returns the tag.
    """
    client = client or docker_client()
    tag = tag or wheels_tag(base, packages, python_version)
    if not force and image_exists(client, tag):
        return tag
    require_image(client, base)
    bad = [p for p in packages if not re.match(r"^[A-Za-z0-9_.\-\[\]=<>!~,]+$", p)]
    if bad:
        raise ImageBuildError(f"not a package requirement: {bad[0]!r}")
    with tempfile.TemporaryDirectory(prefix="sao-wheels-") as ctx:
        ctxp = Path(ctx)
        download_wheels(packages, ctxp / "wheels", python_version, log=log)
        reqs = " ".join(f"'{p}'" for p in packages)
        (ctxp / "Dockerfile").write_text(
            f"FROM {base}\n"
            "COPY wheels /tmp/sao-wheels\n"
            "RUN set -e; pip_whl=$(ls /tmp/sao-wheels/pip-*.whl | head -n1); "
            "python3 \"$pip_whl/pip\" install --no-index --no-cache-dir --disable-pip-version-check "
            "--root-user-action=ignore --break-system-packages --find-links /tmp/sao-wheels "
            f"{reqs}; rm -rf /tmp/sao-wheels\n")
        log(f"wheels: building {tag} from {base} (network none)")
        build_context(client, ctxp, tag, log=log)
    return tag


def build_context(client, ctx: Path, tag: str, *, log=_log, labels: dict | None = None) -> None:
    """Classic ``docker build`` of directory ``ctx`` with ``--network none --force-rm``; progress logged."""
    stream = client.api.build(path=str(ctx), tag=tag, network_mode="none", forcerm=True, rm=True, decode=True,
                              labels={IMAGE_LABEL: OWNER_VALUE, **(labels or {})})
    tail: list[str] = []
    for msg in stream:
        if "error" in msg:
            raise ImageBuildError(f"build of {tag} failed: {msg['error'].strip()}\n" + "\n".join(tail[-10:]))
        text = msg.get("stream", "").rstrip()
        if text:
            tail = (tail + [text])[-20:]
            if text.startswith("Step "):
                log(f"  build: {text}")
    if not image_exists(client, tag):
        raise ImageBuildError(f"build of {tag} finished without the image:\n" + "\n".join(tail[-10:]))
