"""The task images an episode or a grading run needs, there before the first container starts.

``prepare_task_images(cfg, client, source, tasks, *, pull, log)``:
- ``source`` is a task repo: its images are built (``tasks.build``; cached by recipe hash), a failed
  build is a ``UserError``; the build progress is printed only when an image was missing;
- otherwise the images must exist locally; with ``pull=True`` the missing ones are pulled where
  Docker Hub answers (``sao eval`` on official swebench images), else it is a ``UserError``.
"""
from __future__ import annotations

import httpx

from core.errors import UserError
from tasks.build import build_task_repo, resolve_base_image
from tasks.grade import image_exists
from tasks.loaders import resolve_task_repo

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
    results = build_task_repo(client, repo, base, only=[t.instance_id for t in tasks],
                              log=log if missing else (lambda *_: None))
    failed = [r for r in results if r.status == "failed"]
    if failed:
        raise UserError(f"{len(failed)} task image(s) failed to build, e.g. {failed[0].instance_id}: "
                        f"{failed[0].error.splitlines()[0] if failed[0].error else '?'}")


def pull_images(client, images: list[str], log=print) -> None:
    """Pull ``images`` from Docker Hub; a clear error when it does not answer."""
    reason = registry_unreachable_reason()
    if reason is not None:
        raise UserError(f"{len(images)} task image(s) missing locally, e.g. {images[0]}, and Docker Hub is "
                        f"unreachable ({reason}); build them (sao tasks build --task-repo DIR) or run where "
                        "a registry is reachable")
    for i, image in enumerate(images, 1):
        log(f"[{i}/{len(images)}] pulling {image}")
        try:
            client.images.pull(image)
        except Exception as e:  # noqa: BLE001  (whatever fails a pull, the user reads why)
            raise UserError(f"pulling {image} failed: {type(e).__name__}: {e}") from None


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
    pull_images(client, missing, log=log)
