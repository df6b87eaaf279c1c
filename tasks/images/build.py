"""Build the images of a swebench 5.x task repository, offline and cached.

Each ``tasks/<id>/Dockerfile`` starts with ``ARG BASE_IMAGE`` / ``FROM ${BASE_IMAGE}``; the builder
passes the project's base image (or the one named), so a task repository written elsewhere builds
here unchanged. Builds use docker-py's classic builder with ``network_mode="none"`` and
``forcerm=True``, with the task directory as build context, and tag the image with the row's
``image`` name.

Cache: an image is skipped when it exists and its ``sao.recipe`` label equals the recipe hash of
(Dockerfile + build context files + base image id); anything changed -> rebuilt.
"""
from __future__ import annotations

import hashlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sao_harness.core.errors import UserError
from sao_harness.envs.images import ensure_base_image, image_exists
from sao_harness.tasks.formats.loaders import load_tasks_lenient
from sao_harness.tasks.model import Task

RECIPE_LABEL = "sao.recipe"
TASK_LABEL = "sao.task"
BASE_LABEL = "sao.base"
# swebench task-repo files the harness reads itself; part of the build context only if the
# Dockerfile names them
METADATA_FILES = {"task.yaml", "tests.json", "problem_statement.md", "hints.md", "gold.patch",
                  "test.patch", "eval.sh"}
METADATA_DIRS = {"test_assets", "problem_assets"}


@dataclass
class BuildResult:
    instance_id: str
    image: str
    status: str  # "built" | "cached" | "failed"
    seconds: float
    error: str = ""


def recipe_hash(task_dir: Path, base_image_id: str) -> str:
    """sha256 over the Dockerfile, the build-context files it can COPY, and the base image id."""
    task_dir = Path(task_dir)
    dockerfile = (task_dir / "Dockerfile").read_text()
    h = hashlib.sha256()
    h.update(b"base\0" + base_image_id.encode() + b"\0")
    h.update(b"Dockerfile\0" + dockerfile.encode() + b"\0")
    for path in sorted(p for p in task_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(task_dir)
        top = rel.parts[0]
        if str(rel) == "Dockerfile":
            continue
        if (top in METADATA_FILES or top in METADATA_DIRS) and top not in dockerfile:
            continue
        h.update(str(rel).encode() + b"\0")
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()[:32]


def uses_base_arg(dockerfile: str) -> bool:
    lines = [ln.strip() for ln in dockerfile.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    return bool(lines) and lines[0].split()[:2] == ["ARG", "BASE_IMAGE"] and any(
        ln.upper().startswith("FROM") and ("${BASE_IMAGE}" in ln or "$BASE_IMAGE" in ln) for ln in lines[1:3])


def image_state(client, image: str) -> tuple[bool, str | None]:
    """(exists, recipe label) of a local image."""
    import docker  # lazy: the Docker SDK, only where an engine is used

    try:
        img = client.images.get(image)
    except docker.errors.ImageNotFound:
        return False, None
    return True, (img.labels or {}).get(RECIPE_LABEL)


def build_one(client, task_dir: Path, image: str, base: str, base_id: str, *, force: bool = False,
              nocache: bool = False, instance_id: str | None = None) -> BuildResult:
    """Build (or reuse) the image of one task directory (``nocache``: no docker layer cache either)."""
    import docker  # lazy: the Docker SDK, only where an engine is used

    iid = instance_id or task_dir.name
    t0 = time.monotonic()
    recipe = recipe_hash(task_dir, base_id)
    exists, label = image_state(client, image)
    if exists and label == recipe and not force:
        return BuildResult(iid, image, "cached", time.monotonic() - t0)
    old_id = client.images.get(image).id if exists else None
    try:
        new_image, _ = client.images.build(path=str(task_dir), dockerfile="Dockerfile", tag=image,
                            buildargs={"BASE_IMAGE": base}, forcerm=True, rm=True, network_mode="none",
                            pull=False, nocache=nocache,
                            labels={RECIPE_LABEL: recipe, TASK_LABEL: iid, BASE_LABEL: base})
    except docker.errors.BuildError as e:
        tail = [str(x.get("stream") or x.get("error") or "").rstrip() for x in (e.build_log or [])]
        tail = [t for t in tail if t][-12:]
        return BuildResult(iid, image, "failed", time.monotonic() - t0,
                           f"{e.msg}\n" + "\n".join("    " + t for t in tail))
    except docker.errors.APIError as e:
        return BuildResult(iid, image, "failed", time.monotonic() - t0, f"Docker API error: {e.explanation or e}")
    if old_id and old_id != new_image.id:  # the replaced image would linger untagged
        try:
            client.images.remove(old_id)
        except docker.errors.APIError:
            pass  # still used by a container or another tag: leave it
    return BuildResult(iid, image, "built", time.monotonic() - t0)


def resolve_base_image(cfg, client, base_image: str | None = None, *, log=print) -> str:
    """The base image to build FROM: the one named, else ``envs.images.ensure_base_image`` (which
    honours ``docker.base_image`` and builds the project's debootstrap image when missing)."""
    if base_image is None:
        return ensure_base_image(client, cfg.docker, log=log)
    if not image_exists(client, base_image):
        raise UserError(f"--base-image {base_image}: not found locally (no registry is used; "
                        "build or load it first, or omit --base-image for the project's base image)")
    return base_image


def build_task_repo(client, repo: Path, base: str, *, tasks: list[Task] | None = None, only: list[str] | None = None,
                    force: bool = False, nocache: bool = False, log=print) -> list[BuildResult]:
    """Build every task image of ``repo`` (or those in ``only``) on ``base``, printing progress; ``tasks``: the
    repo's tasks a caller loaded already (not read again)."""
    if tasks is None:
        tasks, errors = load_tasks_lenient(str(repo), adapter="swebench", instances=only)
    else:
        errors = []
    results: list[BuildResult] = []
    for e in errors:
        results.append(BuildResult(e.instance_id or "?", "", "failed", 0.0, str(e)))
        log(f"  {e.instance_id}: skipped: {e}")
    base_id = client.images.get(base).id
    n = len(tasks)
    for i, task in enumerate(tasks, 1):
        task_dir = repo / "tasks" / task.instance_id
        if task.image is None:
            results.append(BuildResult(task.instance_id, "", "failed", 0.0, "task.yaml has no image name"))
            log(f"[{i}/{n}] {task.instance_id}: failed: task.yaml has no image name")
            continue
        if not (task_dir / "Dockerfile").is_file():
            results.append(BuildResult(task.instance_id, task.image, "failed", 0.0, "no Dockerfile"))
            log(f"[{i}/{n}] {task.instance_id}: failed: no Dockerfile in {task_dir}")
            continue
        if not uses_base_arg((task_dir / "Dockerfile").read_text()):
            log(f"[{i}/{n}] {task.instance_id}: note: Dockerfile does not start with ARG BASE_IMAGE / "
                "FROM ${BASE_IMAGE}; the base image is not used")
        log(f"[{i}/{n}] {task.instance_id}: {task.image} ...")
        sys.stdout.flush()
        r = build_one(client, task_dir, task.image, base, base_id, force=force, nocache=nocache,
                     instance_id=task.instance_id)
        results.append(r)
        msg = f"[{i}/{n}] {task.instance_id}: {r.status} in {r.seconds:.1f} s"
        log(msg + (f"\n{r.error}" if r.error else ""))
    return results
