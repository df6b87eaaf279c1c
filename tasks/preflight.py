"""Before the first episode: which selected tasks can run and be graded here, and why the others cannot.

``usable_tasks(tasks, errors, *, skip, image_problem, log)`` sorts the tasks a source gave (and the
rows that did not validate) into usable ones and reasons, prints ``tasks: N of M usable`` and one line
per reason with a count and examples, then returns the usable tasks (``skip=True``: the
``tasks.skip_ungradable`` setting) or raises ``UserError`` (exit 2) naming the reasons. A task is
usable when it is gradable (``Task.missing_fields``) and ``image_problem(task)`` is None.

``image_check(cfg, source, pull=)`` is that image test for a run: a task repo's images are built
before the episodes (``tasks.images``), so they count as available; any other image must be present
locally, or (``pull=True``, ``sao eval``) Docker Hub must answer, as the run pulls it.
``preflight(cfg, tasks, errors, source=, log=)`` is the one call ``sao rollout``, ``sao train`` and
``sao eval`` make.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from sao_harness.core.errors import UserError
from sao_harness.tasks.formats.loaders import resolve_task_repo
from sao_harness.tasks.model import Task, TaskError

EXAMPLES = 3


def reason_of(task: Task, image_problem: Callable[[Task], str | None]) -> str | None:
    """Why ``task`` cannot run here, grouped by cause (None: usable)."""
    missing = task.missing_fields()
    if missing:
        why = task.why(missing[0])
        return f"not gradable: no {missing[0]}" + (f" ({why})" if why else "")
    return image_problem(task)


def usable_tasks(tasks: list[Task], errors: list[TaskError], *, skip: bool,
                 image_problem: Callable[[Task], str | None] = lambda t: None, log=print,
                 what: str = "tasks") -> list[Task]:
    """The usable tasks; prints the count and the grouped reasons; raises unless ``skip`` (module doc)."""
    groups: dict[str, list[str]] = defaultdict(list)
    for e in errors:
        groups[f"invalid row: field '{e.field}'" if e.field else "invalid row"].append(str(e))
    usable = []
    for t in tasks:
        why = reason_of(t, image_problem)
        if why is None:
            usable.append(t)
        else:
            groups[why].append(t.instance_id)
    total = len(tasks) + len(errors)
    formats = sorted({t.adapter for t in tasks if t.adapter})
    log(f"{what}: {len(usable)} of {total} usable" + (f" (format: {', '.join(formats)})" if formats else ""))
    for why, ids in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        more = f", +{len(ids) - EXAMPLES} more" if len(ids) > EXAMPLES else ""
        log(f"  {len(ids)} x {why}: {'; '.join(ids[:EXAMPLES])}{more}")
    if groups and not skip:
        heads = "; ".join(sorted({why.split(" (")[0] for why in groups}))  # the details are on the lines above
        raise UserError(f"{total - len(usable)} of {total} {what} not usable ({heads}); "
                        "fix them, or set tasks.skip_ungradable=true to go on with the usable ones")
    if not usable:
        raise UserError(f"no usable {what} (of {total})")
    return usable


def image_check(cfg, source: str, *, pull: bool = False) -> Callable[[Task], str | None]:
    """The image test of ``usable_tasks`` for ``source`` (module doc)."""
    if resolve_task_repo(source) is not None:
        return lambda task: None  # built before the first episode (tasks.images.prepare_task_images)
    # lazy: docker-py and httpx are heavy; only a run that grades needs them
    from sao_harness.envs.engine import ensure_engine
    from sao_harness.envs.images import image_exists
    from sao_harness.tasks.images.prepare import registry_unreachable_reason

    client = ensure_engine(cfg.docker)
    present: dict[str, bool] = {}
    registry: list[str | None] = []  # asked once, when the first image is missing

    def problem(task: Task) -> str | None:
        if task.image not in present:
            present[task.image] = image_exists(client, task.image)
        if present[task.image]:
            return None
        if pull:
            if not registry:
                registry.append(registry_unreachable_reason())
            if registry[0] is None:
                return None
            return f"image not present locally, and Docker Hub is unreachable ({registry[0]})"
        return "image not present locally (no registry is used here: build or load it first)"
    return problem


def preflight(cfg, tasks: list[Task], errors: list[TaskError], *, source: str | None = None, pull: bool = False,
              log=print) -> list[Task]:
    """``usable_tasks`` with ``cfg.tasks.skip_ungradable`` and the run's image test (module doc)."""
    source = source or cfg.tasks.source
    gradable = any(not t.missing_fields() for t in tasks)  # images are only looked up for gradable tasks
    check = image_check(cfg, source, pull=pull) if gradable else (lambda task: None)
    return usable_tasks(tasks, errors, skip=cfg.tasks.skip_ungradable, image_problem=check, log=log)
