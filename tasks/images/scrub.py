"""Which task images get their repository's later history scrubbed at sandbox start (envs.scrub).

``sandbox.scrub_history``: ``always``, ``never``, or ``auto`` (the default): every image except one
the project built and verified. That is decided here only, by ``history_verified(client, image,
instance_id)``, from the image's labels on the local engine: ``image`` is the image the bundled task
``instance_id`` names, and ``tasks.images.build`` labelled it with that task and a recipe hash equal to that
of ``tasks/bundled/tasks/<id>`` on the base image it names (the same Dockerfile and ``repo.bundle``,
whose history up to the base commit only is proven by ``tests/tasks/test_bundled_suite.py`` and
``sao tasks check``'s ``history`` proof). ``sao-harness.built-by`` alone proves nothing: every image
built FROM the project's base image inherits it (and one built FROM a bundled task's image inherits
that image's labels), whatever history its own layers add.

``sandbox_image(client, task, sandbox_cfg, docker_cfg)`` is the episode's call: the image its sandbox
starts from, the task's own when spared, else its scrubbed copy (``envs.scrub.scrubbed_image``: made
once per image and node, then reused).
"""
from __future__ import annotations

from pathlib import Path

import yaml

from sao_harness.envs.config import DockerConfig, SandboxConfig
from sao_harness.envs.scrub import ScrubResult, scrubbed_image
from sao_harness.tasks.formats.loaders import BUNDLED
from sao_harness.tasks.images.build import BASE_LABEL, RECIPE_LABEL, TASK_LABEL, recipe_hash

MODES = ("auto", "always", "never")


def history_verified(client, image: str, instance_id: str) -> bool:
    """True when ``image`` is the project's build of the bundled task ``instance_id`` (module doc)."""
    import docker  # lazy: docker-py is heavy (it pulls in requests)

    task_dir = BUNDLED / "tasks" / instance_id
    if ("/" in instance_id or instance_id.startswith(".") or not (task_dir / "Dockerfile").is_file()
            or _tag(image) != _tag(_bundled_image(task_dir))):
        return False  # not a bundled task, or another image (one built FROM it inherits its labels)
    try:
        labels = client.images.get(image).labels or {}
        base_id = client.images.get(labels[BASE_LABEL]).id
    except (KeyError, docker.errors.ImageNotFound):
        return False
    return labels.get(TASK_LABEL) == instance_id and labels.get(RECIPE_LABEL) == recipe_hash(task_dir, base_id)


def _bundled_image(task_dir: Path) -> str:
    try:
        return str(yaml.safe_load((task_dir / "task.yaml").read_text()).get("image") or "")
    except (OSError, yaml.YAMLError, AttributeError):
        return ""


def _tag(image: str) -> str:
    """``image`` with its implicit ``:latest`` written out."""
    return image if ":" in image.rsplit("/", 1)[-1] else f"{image}:latest"


def scrub_needed(mode: str, client, image: str, instance_id: str) -> bool:
    """Whether a sandbox of ``image`` (task ``instance_id``) is scrubbed under ``sandbox.scrub_history=mode``."""
    if mode not in MODES:
        raise ValueError(f"sandbox.scrub_history: {mode!r} is not one of {', '.join(MODES)}")
    return mode == "always" or (mode == "auto" and not history_verified(client, image, instance_id))


def sandbox_image(client, task, cfg: SandboxConfig, docker_cfg: DockerConfig) -> tuple[str, ScrubResult | None]:
    """(image, scrub result): what a sandbox of ``task`` starts from under ``cfg.scrub_history``.

    ``task.image`` and None when spared; else the scrubbed copy, with the result of the scrub that made
    it (None when it was already made). A failure is ``envs.scrub.ScrubError`` (a ``SandboxError``: an
    infra error).
    """
    if not scrub_needed(cfg.scrub_history, client, task.image, task.instance_id):
        return task.image, None
    return scrubbed_image(client, task.image, task.base_commit, cfg, docker_cfg)
