"""`sao rollout` and `sao eval` enter the task loader once per run, and pre-flight once.

Each entry point loads and pre-flights its tasks and passes the list down (``run_rollout(cfg, tasks)``);
nothing below it loads them again: not the rollout, not the eval's predictions, not the expert engine.
The loader (``tasks.formats.loaders``: ``load_tasks_lenient``, ``load_tasks``, ``tasks_from_config``,
``load_task_repo``) is wrapped at every module that holds it with a wrapper that records the outermost
entries and who made them; each test is one real CLI run (expert engine, Docker sandbox, official grader)
on a bundled task. The image builder of a task repo (``tasks.images.build.build_task_repo``) is handed the
loaded tasks (it reads the repo only for `sao tasks build`), and runs once per run (the eval prepares the
images once: ``run_rollout(..., images_ready=True)``).
"""
from __future__ import annotations

import functools
import importlib
import json
import sys
import threading
from typing import NamedTuple

import pytest

from sao_harness.sao.cli import main

pytestmark = pytest.mark.docker

TASK = "sao-harness__minicfg-8"
LOADERS = ("load_tasks_lenient", "load_tasks", "tasks_from_config", "load_task_repo")
# the modules on the paths of `sao rollout` and `sao eval` (imported lazily by the CLI): bound before the scan
MODULES = ("sao_harness.harness.cli", "sao_harness.harness.rollout", "sao_harness.harness.runner",
           "sao_harness.harness.engines.expert", "sao_harness.eval.cli", "sao_harness.eval.run",
           "sao_harness.eval.predict", "sao_harness.tasks.preflight", "sao_harness.tasks.images.build")


class Entry(NamedTuple):
    loader: str  # the loader function entered
    caller: str  # the module that entered it


@pytest.fixture
def builds(monkeypatch) -> list[list[str]]:
    """The task ids of each call of the image builder of a task repo (images prepared for a run)."""
    from sao_harness.tasks.images import prepare

    calls: list[list[str]] = []
    build = prepare.build_task_repo

    def counting(client, repo, base, *, tasks=None, **kwargs):
        calls.append([t.instance_id for t in tasks] if tasks is not None else ["<read from the repo>"])
        return build(client, repo, base, tasks=tasks, **kwargs)

    monkeypatch.setattr(prepare, "build_task_repo", counting)
    return calls


@pytest.fixture
def loader_entries(monkeypatch) -> list[Entry]:
    """The loader functions entered from outside the loader, one per entry, in order, with their callers."""
    from sao_harness.tasks.formats import loaders

    for name in MODULES:
        importlib.import_module(name)
    entries: list[Entry] = []
    depth = threading.local()

    def counting(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            n = getattr(depth, "n", 0)
            if n == 0:  # a loader function calling another is one entry
                entries.append(Entry(fn.__name__, sys._getframe(1).f_globals.get("__name__", "?")))
            depth.n = n + 1
            try:
                return fn(*args, **kwargs)
            finally:
                depth.n = n

        return wrapper

    wrapped = {id(fn): counting(fn) for fn in (getattr(loaders, name) for name in LOADERS)}
    patched = []
    for module in list(sys.modules.values()):
        if not getattr(module, "__name__", "").startswith("sao_harness"):
            continue
        for attr, value in list(vars(module).items()):
            if id(value) in wrapped and callable(value):
                monkeypatch.setattr(module, attr, wrapped[id(value)])
                patched.append(f"{module.__name__}.{attr}")
    assert "sao_harness.tasks.formats.loaders.load_tasks_lenient" in patched
    return entries


def overrides(project_root, tmp_path) -> list[str]:
    return [f"run.root={tmp_path}", "run.name=once", "engine.kind=expert", "agent.profile=compact",
            "sampling.max_tokens=4096", "agent.stuck_detection=false", "rollout.workers=1",
            f"model.cache_dir={project_root / '.cache/sao'}"]


def test_sao_rollout_loads_its_tasks_once(docker_engine, project_root, tmp_path, loader_entries, builds, capsys):
    from sao_harness.harness.store import TraceStore

    rc = main(["rollout", "--config", str(project_root / "configs/local.yaml"), f"tasks.instances=[{TASK}]",
               *overrides(project_root, tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    loads = loader_entries
    assert len(loads) == 1, loads  # the CLI's; not again in run_rollout, the image builder or the expert engine
    assert loads[0].caller == "sao_harness.harness.runner", loads  # harness.runner.load_tasks, as `sao train`
    assert builds == [[TASK]], builds  # the images prepared once (run_rollout), from the loaded tasks
    assert out.count("tasks: 1 of 1 usable") == 1, out  # pre-flighted once
    [traj] = list(TraceStore(tmp_path / "once"))
    assert traj.task_id == TASK and traj.reward == 1.0


def test_sao_eval_loads_its_tasks_once(docker_engine, project_root, tmp_path, loader_entries, builds, capsys):
    rc = main(["eval", "--config", str(project_root / "configs/local.yaml"), "--instances", TASK, "eval.name=once",
               *overrides(project_root, tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    loads = loader_entries
    assert len(loads) == 1, loads  # select_tasks'; not again in predict/run_rollout, the builder or the engine
    assert loads[0].caller == "sao_harness.eval.run", loads
    assert builds == [[TASK]], builds  # the images prepared once (run_eval), not again by run_rollout
    assert out.count("tasks: 1 of 1 usable") == 1, out  # pre-flighted once
    assert out.rstrip().endswith("resolved: 1/1 guarded, 1/1 official"), out
    preds = [json.loads(x) for x in (tmp_path / "once" / "eval" / "once" / "predictions.jsonl").read_text().splitlines()
             if x.strip()]
    assert [p["instance_id"] for p in preds] == [TASK]
