"""The task images an episode or a grading run needs, there before the first container starts, on every node.

``prepare_task_images(cfg, client, source, tasks, *, pull, log)``:
- ``source`` is a task repo: its images are built (``tasks.images.build``; cached by recipe hash), a failed
  build is a ``UserError``; the build progress is printed only when an image was missing;
- otherwise the images must exist locally; with ``pull=True`` the missing ones are fetched from
  ``docker.image_sources`` (``envs.pull``: a registry, a directory of tarballs, another engine), else
  it is a ``UserError``.

``prepare_node(cfg, source, tasks)``, one node's part of ``sao images pull`` (``trainer.run.images``, which runs
it here or on every sandbox node of a Ray cluster): build a task repo's images, or fetch the missing ones,
``docker.pull_concurrency`` at a time, within ``docker.image_cache_bytes``; then the scrubbed copy of each
image that ``sandbox.scrub_history`` scrubs (``tasks.scrub``).
``sao images save --dir D`` writes the selected images as ``docker save`` tarballs for a ``dir:D`` source.
"""
from __future__ import annotations

from pathlib import Path

import httpx

from sao_harness.core.errors import UserError
from sao_harness.envs.engine import docker_client
from sao_harness.envs.errors import SandboxError
from sao_harness.envs.images import image_exists
from sao_harness.envs.pull import fetch_images, save_images
from sao_harness.tasks.formats.loaders import resolve_task_repo, tasks_from_config
from sao_harness.tasks.images.build import build_task_repo, resolve_base_image
from sao_harness.tasks.images.scrub import sandbox_image

REGISTRY = "registry-1.docker.io"


def registry_unreachable_reason(timeout: float = 4.0) -> str | None:
    """None when Docker Hub answers, else why not."""
    try:
        r = httpx.get(f"https://{REGISTRY}/v2/", timeout=timeout)
    except (httpx.HTTPError, OSError) as e:
        return f"{type(e).__name__} contacting {REGISTRY}"
    return None if r.status_code in (200, 401) else f"HTTP {r.status_code} from {REGISTRY}"


def build_repo_images(cfg, client, repo, tasks, log=print) -> None:
    """Build (or find cached) the images of ``tasks`` of the task repo ``repo``; fail on a failed build."""
    missing = [t.instance_id for t in tasks if not image_exists(client, t.image)]
    if missing:
        log(f"building {len(missing)} missing task image(s) of {repo}")
    base = resolve_base_image(cfg, client, log=log)
    results = build_task_repo(client, repo, base, tasks=list(tasks),
                              log=log if missing else (lambda *_: None))
    failed = [r for r in results if r.status == "failed"]
    if failed:
        raise UserError(f"{len(failed)} task image(s) failed to build, e.g. {failed[0].instance_id}: "
                        f"{failed[0].error.splitlines()[0] if failed[0].error else '?'}")


def pull_images(cfg, client, images: list[str], log=print) -> None:
    """Fetch ``images`` from ``docker.image_sources``; a clear error naming why when one cannot be had."""
    if cfg.docker.image_sources == ["registry"]:
        reason = registry_unreachable_reason()
        if reason is not None:
            raise UserError(f"{len(images)} task image(s) missing locally, e.g. {images[0]}, and Docker Hub is "
                            f"unreachable ({reason}); build them (sao tasks build --task-repo DIR), load them "
                            "(docker.image_sources: dir:/PATH or engine:URL) or run where a registry is reachable")
    result = fetch_images(client, images, cfg.docker, log=log)
    if result["failed"]:
        why = next(iter(result["failed"].values()))
        raise UserError(f"{len(result['failed'])} task image(s) could not be fetched, e.g. {why}")


def prepare_task_images(cfg, client, source: str, tasks, *, pull: bool, log=print) -> None:
    """Every image of ``tasks`` (of the task source ``source``) exists locally afterwards (module doc)."""
    tasks = list(tasks)
    repo = resolve_task_repo(source)
    if repo is not None:
        build_repo_images(cfg, client, repo, tasks, log=log)
        return
    missing = sorted({t.image for t in tasks if not image_exists(client, t.image)})
    if not missing:
        return
    if not pull:
        raise UserError(f"{len(missing)} task image(s) missing locally, e.g. {missing[0]} (no registry is used here; "
                        "build them with `sao tasks build --task-repo DIR` or pull them where a registry is reachable)")
    pull_images(cfg, client, missing, log=log)


def task_images(tasks) -> list[str]:
    """The distinct images of ``tasks``, in order (tasks without one have nothing to pull)."""
    return list(dict.fromkeys(t.image for t in tasks if t.image))


def prepare_node(cfg, source: str, tasks, *, progress: bool = True, log=print) -> dict:
    """On this node's engine (``envs.engine.docker_client``): a task repo's images built, or the tasks'
    missing images fetched; a summary {"node", "engine", "images", "present", "pulled", "failed", "evicted"}."""
    import socket  # lazy: only a node that pulls names itself

    client = docker_client(cfg.docker)
    images = task_images(tasks)
    out = {"node": socket.gethostname(), "engine": client.sao_docker_host, "images": len(images)}
    repo = resolve_task_repo(source)
    if repo is not None:
        try:
            build_repo_images(cfg, client, repo, tasks, log=log)
            out.update(present=images, pulled={}, failed={}, evicted=[])
        except UserError as e:
            return {**out, "present": [], "pulled": {}, "failed": {str(repo): str(e)}, "evicted": [], "scrubbed": 0}
    else:
        out.update(fetch_images(client, images, cfg.docker, progress=progress, log=log))
    ready = [t for t in tasks if t.image and t.image not in out["failed"]]
    scrubbed, failed = scrub_images(cfg, client, ready, progress=progress, log=log)
    return {**out, "scrubbed": scrubbed, "failed": {**out["failed"], **failed}}


def scrub_images(cfg, client, tasks, *, progress: bool = True, log=print) -> tuple[int, dict[str, str]]:
    """Make the scrubbed copy of each task's image that needs one (``tasks.scrub.sandbox_image``) now, so
    that no sandbox start pays for it: (copies made now, {image: why its scrub failed})."""
    from tqdm import tqdm  # lazy: only the command that prepares images shows a bar

    made, failed = 0, {}
    for task in tqdm(tasks, unit="task", desc="scrub", disable=None if progress else True):
        try:
            image, result = sandbox_image(client, task, cfg.sandbox, cfg.docker)
        except SandboxError as e:
            failed[task.image] = f"{task.instance_id}: {e}"
            log(f"images: {task.instance_id}: {e}")
            continue
        if result is not None:
            made += 1
            log(f"images: {task.instance_id}: {task.image} scrubbed to {task.base_commit[:12]} as {image} "
                f"({result.seconds:.1f} s, {result.refs_deleted} refs deleted)")
    return made, failed


def summary_line(r: dict) -> str:
    sources = sorted(set(r["pulled"].values()))
    return (f"node {r['node']} (engine {r['engine']}): {r['images']} image(s): {len(r['present'])} present, "
            f"{len(r['pulled'])} fetched{' from ' + ', '.join(sources) if sources else ''}, {len(r['failed'])} "
            f"failed, {len(r['evicted'])} evicted, {r['scrubbed']} scrubbed")


def cmd_save(args) -> int:
    """``sao images save --dir D``: the selected tasks' images of this engine as tarballs in D."""
    tasks, _errors = tasks_from_config(args.cfg)
    images = task_images(tasks)
    client = docker_client(args.cfg.docker)
    missing = [i for i in images if not image_exists(client, i)]
    if missing:
        raise UserError(f"{len(missing)} image(s) not on this engine, e.g. {missing[0]}: pull or build them first")
    save_images(client, images, Path(args.dir))
    print(f"images: {len(images)} tarball(s) in {args.dir} (use it with docker.image_sources: [dir:{args.dir}])")
    return 0
