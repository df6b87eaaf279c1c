"""A bundled task as a row of each public SWE training format, with the image that format expects.

Each ``as_<format>(task, client)`` returns ``(row, note)``: the bundled ``task`` (``tasks/bundled``) in
the columns that dataset publishes, its eval left for the adapter to write the way the format writes
it, and the task's image where the format's adapter will look for it:
- ``swebench``: the row as SWE-bench's 5.x export carries it (its own ``eval_script``, image name);
- ``swe-gym``: SWE-bench columns without ``environment_setup_commit`` or grading columns; the image
  tagged ``xingyaoww/sweb.eval.x86_64.<id, __ -> _s_>``; the repo's test command must be in
  ``tasks.formats.specs.SWE_GYM`` (``SWE_GYM_SPEC``, as SWE-Gym's harness has one per repo);
- ``swe-rebench``: ``install_config`` (``test_cmd``, ``log_parser``) and ``docker_image``, tagged;
- ``swe-smith``: built from the task's image, SWE-smith's layout: the graded tests in the repository
  and the bug on the instance's branch at ``base_commit`` (the base commit plus the test patch, one
  commit; no branch holds the fix); the row's ``patch`` introduces the bug (the gold patch reversed);
  the package importable from any directory, as SWE-smith's editable install makes it;
- ``r2e-gym``: built from the task's image, R2E-Gym's layout: the test patch's files at
  ``/r2e_tests/test_<n>.py`` (outside the repository, which stays at the base commit), an untracked
  ``/testbed/run_tests.sh`` that runs ``.venv/bin/python -W ignore -m pytest -rA r2e_tests``, a
  ``/testbed/.venv`` (git-excluded); the row: ``repo_name, docker_image, commit_hash,
  parsed_commit_content, execution_result_content`` (a pre-fix run: FAIL_TO_PASS failed, PASS_TO_PASS
  passed), ``expected_output_json``, tests named R2E's way (``Class.test``). R2E-Gym's fix is in
  ``parsed_commit_content``, which the adapter does not turn into a diff: ``note`` says so, and the
  expert needs the bundled gold patch (``with_gold``).
The variant images are built offline (``network_mode=none``) from the bundled image in a few seconds.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import tarfile

from unidiff import PatchSet

from sao_harness.envs.images import read_image_file
from sao_harness.tasks.formats.adapters import r2e_key, reverse_patch, swe_gym_image
from sao_harness.tasks.formats.evalscript import test_files
from sao_harness.tasks.model import Task

GRADING = ("eval_script", "log_parser", "eval_type", "image")
REPO_ONLY = ("split", "datasets", "difficulty")  # a task repo's own columns, no dataset's
PYTEST = "python3 -m pytest -rA -p no:cacheprovider"  # the bundled repos' test command (tests import the package)
SWE_GYM_SPEC = {"test_cmd": PYTEST}
PTH = "echo /testbed > \"$(python3 -c 'import site; print(site.getsitepackages()[0])')/testbed.pth\""


def _columns(task: Task, drop=()) -> dict:
    row = task.to_row()
    return {k: v for k, v in row.items() if k not in (*REPO_ONLY, *drop)}


def _tag(client, image: str, name: str) -> str:
    repo, _, tag = name.partition(":")
    client.images.get(image).tag(repo, tag or "latest")
    return name


def _build(client, tag: str, dockerfile: str, files: dict[str, bytes]) -> str:
    """Build ``dockerfile`` with ``files`` as its context, offline; ``tag`` names the image."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in {"Dockerfile": dockerfile.encode(), **files}.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755 if name.endswith(".sh") else 0o644
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    client.images.build(fileobj=buf, custom_context=True, tag=tag, network_mode="none", rm=True, forcerm=True)
    return tag


def with_gold(task: Task, gold: str) -> Task:
    """``task`` with ``gold`` as its patch (the expert's plan; the grader never reads it)."""
    return dataclasses.replace(task, patch=gold)


def as_swebench(task: Task, client) -> tuple[dict, str]:
    return _columns(task), ""


def as_swe_gym(task: Task, client) -> tuple[dict, str]:
    _tag(client, task.image, swe_gym_image(task.instance_id))
    return _columns(task, drop=(*GRADING, "environment_setup_commit", "episode_setup")), ""


def swe_rebench_image(task: Task) -> str:
    return f"swerebench/sweb.eval.x86_64.{task.instance_id.replace('__', '_1776_')}".lower()


def as_swe_rebench(task: Task, client) -> tuple[dict, str]:
    _tag(client, task.image, swe_rebench_image(task))
    return _columns(task, drop=GRADING) | {
        "docker_image": swe_rebench_image(task), "FAIL_TO_FAIL": [], "PASS_TO_FAIL": [],
        "install_config": {"install": "pip install -e .", "log_parser": "parse_log_pytest", "test_cmd": PYTEST,
                           "python": "3.11", "env_vars": None},
        "meta": {"commit_name": "head_commit", "has_test_patch": True, "is_lite": True}}, ""


def as_swe_smith(task: Task, client) -> tuple[dict, str]:
    owner, repo = task.repo.split("/")
    commit8 = task.base_commit[:8]
    profile = f"{owner}__{repo}.{commit8}"
    iid = f"{profile}.func_pm_{task.instance_id.rsplit('-', 1)[-1]}"
    image = f"jyangballin/swesmith.x86_64.{owner}_1776_{repo}.{commit8}".lower()
    _build(client, image, f"""FROM {task.image}
COPY test.patch /tmp/test.patch
RUN cd /testbed && git apply /tmp/test.patch && rm /tmp/test.patch \\
 && git checkout -q -b {iid} && git add -A && git commit -q -m {iid} && git branch -D main \\
 && git rev-parse HEAD > /sao-base-commit && {PTH}
""", {"test.patch": task.test_patch.encode()})
    base = read_image_file(client, image, "/sao-base-commit").strip()
    row = {"instance_id": iid, "repo": f"swesmith/{profile}", "patch": reverse_patch(task.patch),
           "FAIL_TO_PASS": task.FAIL_TO_PASS, "PASS_TO_PASS": task.PASS_TO_PASS,
           "created_at": task.extra.get("created_at", ""), "image_name": f"swesmith.x86_64.{profile}",
           "base_commit": base, "problem_statement": task.problem_statement}
    return row, ""


R2E_RUN_TESTS = ".venv/bin/python -W ignore -m pytest -rA r2e_tests\n"


def as_r2e_gym(task: Task, client) -> tuple[dict, str]:
    name = task.repo.split("/")[1]
    commit = hashlib.sha1(task.patch.encode()).hexdigest()  # the fix commit (never in the image)
    image = f"namanjain12/{name}_final:{commit}"
    files = test_files(task.test_patch)
    held = {path: f"r2e_tests/test_{n}.py" for n, path in enumerate(files, 1)}
    copies = " && ".join(f"cp {src} /{dst}" for src, dst in held.items())
    _build(client, image, f"""FROM {task.image}
COPY test.patch /tmp/test.patch
COPY run_tests.sh /testbed/run_tests.sh
RUN cd /testbed && mkdir /r2e_tests && git apply /tmp/test.patch && {copies} && git checkout -q -- . \\
 && rm /tmp/test.patch && python3 -m venv --system-site-packages --without-pip .venv \\
 && echo .venv >> .git/info/exclude && {PTH} && test "$(git rev-parse HEAD)" = {task.base_commit}
""", {"test.patch": task.test_patch.encode(), "run_tests.sh": R2E_RUN_TESTS.encode()})
    expected = {r2e_key(t): "PASSED" for t in task.FAIL_TO_PASS + task.PASS_TO_PASS}
    before = ["=== short test summary info ==="]
    before += [f"FAILED {held[t.split('::')[0]]}::{t.split('::', 1)[1]} - AssertionError" for t in task.FAIL_TO_PASS]
    before += [f"PASSED {held[t.split('::')[0]]}::{t.split('::', 1)[1]}" for t in task.PASS_TO_PASS]
    row = {"repo_name": name, "docker_image": image, "commit_hash": commit,
           "problem_statement": f"[ISSUE]\n{task.problem_statement}\n[/ISSUE]",
           "parsed_commit_content": json.dumps({"old_commit_hash": task.base_commit, "new_commit_hash": commit,
                                                "commit_message": "fix", "file_diffs": []}),
           "execution_result_content": json.dumps({"old_commit_res_stdout": "\n".join(before) + "\n"}),
           "expected_output_json": json.dumps(expected), "modified_files": [f.path for f in PatchSet(task.patch)]}
    return row, "R2E-Gym's fix is in parsed_commit_content (not converted to a diff): the expert gets the gold patch"


FORMATS = {"swebench": as_swebench, "swe-gym": as_swe_gym, "swe-smith": as_swe_smith, "r2e-gym": as_r2e_gym,
           "swe-rebench": as_swe_rebench}
