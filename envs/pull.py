"""Task images on this node's engine: fetched from ordered sources, kept under a disk budget.

Sources (``docker.image_sources``), tried in order; the first that has the image wins:
- ``registry``: ``docker pull`` (the registry the name names; Docker Hub by default);
- ``dir:/PATH``: ``docker load`` of ``/PATH/<tarball_name(image)>``, a ``docker save`` tarball (plain or
  gzip), as ``sao images save`` writes them: no registry, works offline;
- ``engine:URL``: ``docker save`` streamed from the engine at URL into ``docker load`` here.
A source that lacks the image is skipped at once; any other failure is retried ``docker.pull_retries``
times, the k-th retry after ``docker.pull_backoff_s * 2**k`` seconds.

Cache: every image fetched here is recorded with its last use in ``<state_dir>/image-use/<engine id>.json``
(one record per engine); ``ensure_image`` refreshes it on every use. After a fetch, while the recorded
images present sum over ``docker.image_cache_bytes`` (sizes as Docker reports them; null or 0: no
limit), the least recently used is removed. Never evicted: an image this module did not fetch, the base
image, an image a container (running or not) was made from, the image just fetched.

``ensure_image(image, cfg)`` is the episode's call: present -> its use recorded; missing -> fetched
(one fetch per image per node at a time); in no source -> ``ImagePullError``, an infrastructure error.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from pathlib import Path

from sao_harness.core.files import atomic_write, atomic_write_text
from sao_harness.envs.config import DockerConfig, size_bytes
from sao_harness.envs.engine import _client, docker_client
from sao_harness.envs.errors import SandboxError
from sao_harness.envs.images import base_tag, image_exists, load_image_file


class ImagePullError(SandboxError):
    """No source gave the image (message: each source and why)."""


class NotInSource(Exception):
    """The source does not have the image (not retried)."""


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def tarball_name(image: str) -> str:
    """``repo/name:tag`` -> ``repo+name=tag.tar`` (``@`` -> ``%``): one file per image, never two images per file."""
    return image.replace("/", "+").replace(":", "=").replace("@", "%") + ".tar"


def _named(image: str) -> str:
    """The reference ``docker save`` writes into the tarball (a bare name means ``:latest``)."""
    last = image.rsplit("/", 1)[-1]
    return image if ":" in last or "@" in image else f"{image}:latest"


def _load(client, chunks, what: str) -> None:
    for msg in client.api.load_image(chunks):
        if isinstance(msg, dict) and msg.get("error"):
            raise RuntimeError(f"docker load of {what}: {msg['error']}")


# -- sources --------------------------------------------------------------------------------------
def from_registry(client, image: str, _arg: str) -> None:
    import docker  # lazy: docker-py is heavy (it pulls in requests)

    try:
        client.images.pull(image)
    except docker.errors.NotFound as e:
        raise NotInSource(getattr(e, "explanation", None) or str(e)) from None


def from_dir(client, image: str, path: str) -> None:
    tarball = Path(path) / tarball_name(image)
    if not tarball.is_file():
        raise NotInSource(f"no {tarball}")
    load_image_file(client, tarball)


def from_engine(client, image: str, url: str) -> None:
    import docker  # lazy: docker-py is heavy (it pulls in requests)

    src = _client(url)
    try:
        try:
            chunks = src.images.get(image).save(chunk_size=1 << 20, named=_named(image))
        except docker.errors.ImageNotFound:
            raise NotInSource(f"not on {url}") from None
        _load(client, chunks, f"{image} from {url}")
    finally:
        src.close()


SOURCES = {"registry": from_registry, "dir": from_dir, "engine": from_engine}


def fetch(client, image: str, cfg: DockerConfig) -> str:
    """Fetch ``image`` into ``client``'s engine from the first source that has it; return that source."""
    reasons = []
    for source in cfg.image_sources:
        kind, _, arg = source.partition(":")
        for attempt in range(cfg.pull_retries + 1):
            try:
                SOURCES[kind](client, image, arg)
                if not image_exists(client, image):
                    raise RuntimeError(f"the source gave no image named {image}")
                return source
            except NotInSource as e:
                reasons.append(f"{source}: {e}")
                break
            except Exception as e:  # noqa: BLE001  (engine, network, tarball: retried, then the next source)
                why = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
                if attempt == cfg.pull_retries:
                    reasons.append(f"{source}: {why} (after {attempt + 1} attempt(s))")
                else:
                    time.sleep(cfg.pull_backoff_s * 2 ** attempt)
    raise ImagePullError(f"image {image} is not on this node's engine and no source gave it: " + "; ".join(reasons))


# -- the use record and eviction ------------------------------------------------------------------
_ENGINE_IDS: dict[str, str] = {}


def _state_dir(cfg: DockerConfig) -> Path:
    d = Path(cfg.state_dir) / "image-use"
    try:
        d.mkdir(parents=True, exist_ok=True)
        return d
    except OSError:  # not root: a per-user place
        d = Path(tempfile.gettempdir()) / "sao-harness-image-use"
        d.mkdir(parents=True, exist_ok=True)
        return d


def record_path(client, cfg: DockerConfig) -> Path:
    """``<state_dir>/image-use/<engine id>.json``: one record per engine (several may share a host)."""
    url = getattr(client, "sao_docker_host", None)  # our clients (envs.engine); others are asked each time
    engine_id = _ENGINE_IDS.get(url) if url else None
    if engine_id is None:
        engine_id = client.api.info()["ID"]
        if url:
            _ENGINE_IDS[url] = engine_id
    return _state_dir(cfg) / f"{hashlib.sha256(engine_id.encode()).hexdigest()[:16]}.json"


@contextmanager
def _locked(path: Path):
    with open(path.with_suffix(path.suffix + ".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def read_record(path: Path) -> dict[str, dict]:
    """{image: {"used": unix time, "source": where it came from}}."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def touch(path: Path, image: str, source: str | None = None, now: float | None = None) -> None:
    """Record a use of ``image`` (a fetch when ``source`` is given; a use of an unrecorded image is ignored)."""
    with _locked(path):
        rec = read_record(path)
        if source is None and image not in rec:
            return
        entry = rec.setdefault(image, {"source": source})
        entry["used"] = time.time() if now is None else now
        atomic_write_text(path, json.dumps(rec, indent=1, sort_keys=True) + "\n")


def evict(client, cfg: DockerConfig, *, keep=(), log=_log) -> list[str]:
    """Remove least recently used recorded images until they fit ``docker.image_cache_bytes`` (module doc)."""
    import docker  # lazy: docker-py is heavy (it pulls in requests)

    budget = size_bytes(cfg.image_cache_bytes) if cfg.image_cache_bytes else 0
    if not budget:
        return []
    path = record_path(client, cfg)
    removed = []
    with _locked(path):
        rec = read_record(path)
        sizes, ids = {}, {}
        for image in list(rec):
            try:
                attrs = client.api.inspect_image(image)
            except docker.errors.ImageNotFound:
                del rec[image]  # gone (removed by hand): no longer ours to count
                continue
            sizes[image], ids[image] = attrs["Size"], attrs["Id"]
        total = sum(sizes.values())
        in_use = {c["ImageID"] for c in client.api.containers(all=True)}
        protected = set(keep) | {base_tag(cfg)}
        for image in sorted(sizes, key=lambda i: rec[i]["used"]):
            if total <= budget:
                break
            if image in protected or ids[image] in in_use:
                continue
            try:
                client.api.remove_image(image)
            except docker.errors.APIError as e:  # a container made from it meanwhile, or another tag: keep it
                log(f"images: keeping {image} ({getattr(e, 'explanation', None) or e})")
                continue
            total -= sizes.pop(image)
            del rec[image]
            removed.append(image)
            log(f"images: evicted {image} (least recently used; over docker.image_cache_bytes)")
        if total > budget:
            log(f"images: {total} bytes of task images here, over docker.image_cache_bytes={cfg.image_cache_bytes}; "
                f"the rest are in use or protected")
        atomic_write_text(path, json.dumps(rec, indent=1, sort_keys=True) + "\n")
    return removed


# -- the two entry points -------------------------------------------------------------------------
def _fetch_recorded(client, image: str, cfg: DockerConfig) -> str:
    source = fetch(client, image, cfg)
    touch(record_path(client, cfg), image, source)
    evict(client, cfg, keep={image})
    return source


def ensure_image(image: str, cfg: DockerConfig, client=None) -> str | None:
    """``image`` on this node's engine (``envs.engine.docker_client``): None if it was there, else the
    source it was fetched from; ``ImagePullError`` when no source has it (module doc)."""
    if not image:
        raise ImagePullError("the task names no image")
    client = client or docker_client(cfg)
    path = record_path(client, cfg)
    if image_exists(client, image):
        touch(path, image)
        return None
    lock = path.with_name(f"pull-{hashlib.sha256(image.encode()).hexdigest()[:16]}")
    with _locked(lock):  # concurrent workers of this node: one fetch per image
        if image_exists(client, image):
            touch(path, image)
            return None
        return _fetch_recorded(client, image, cfg)


def fetch_images(client, images: list[str], cfg: DockerConfig, *, progress: bool = True, log=_log) -> dict:
    """Every one of ``images`` on ``client``'s engine, ``docker.pull_concurrency`` at a time:
    {"present": [...], "pulled": {image: source}, "failed": {image: why}, "evicted": [...]}."""
    from tqdm import tqdm  # lazy: only the command that pulls shows a bar

    out = {"present": [], "pulled": {}, "failed": {}, "evicted": []}
    images = list(dict.fromkeys(images))
    recorded = set(read_record(record_path(client, cfg)))
    bar = tqdm(total=len(images), unit="image", desc="images", disable=None if progress else True)
    with ThreadPoolExecutor(max_workers=cfg.pull_concurrency) as pool:
        futures = {pool.submit(ensure_image, image, cfg, client): image for image in images}
        for fut in as_completed(futures):
            image = futures[fut]
            try:
                source = fut.result()
            except ImagePullError as e:
                out["failed"][image] = str(e)
                log(f"images: {e}")
            else:
                if source is None:
                    out["present"].append(image)
                else:
                    out["pulled"][image] = source
                    log(f"images: {image} from {source}")
            bar.update(1)
    bar.close()
    out["evicted"] = sorted(i for i in recorded | set(out["pulled"]) if not image_exists(client, i))
    return out


def save_images(client, images: list[str], directory: Path, *, log=_log) -> list[Path]:
    """``docker save`` each of ``images`` to ``directory/tarball_name(image)`` (a ``dir:`` source)."""
    paths = []
    for image in dict.fromkeys(images):
        path = Path(directory) / tarball_name(image)

        def write(f, image=image):
            for chunk in client.images.get(image).save(chunk_size=1 << 20, named=_named(image)):
                f.write(chunk)

        atomic_write(path, write)
        log(f"images: saved {image} to {path}")
        paths.append(path)
    return paths
