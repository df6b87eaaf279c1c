"""Adapters: rows of training sets whose schema differs from SWE-bench 5.x -> swebench-shaped rows.

Each adapter maps what maps and returns notes saying what is missing; a task with gaps is loadable
(an agent can work on it) but not gradable or runnable here, which ``sao tasks check`` reports.

Schemas (Hugging Face dataset cards):
- ``swebench``: SWE-bench / Verified / Lite (classic: FAIL_TO_PASS as JSON text, no image, no eval
  script) and swebench 5.x rows (``image, eval_script, log_parser, eval_type``). Passed through; a
  classic row gets the image name swebench derives (``swebench/sweb.eval.x86_64.<id>:latest``).
- ``swe-gym`` (SWE-Gym/SWE-Gym, SWE-Gym-Lite): ``instance_id, hints_text, patch, test_patch,
  created_at, problem_statement, repo, base_commit, version, PASS_TO_PASS, FAIL_TO_PASS`` (lists).
  Images are published as ``xingyaoww/sweb.eval.x86_64.<id with __ -> _s_>``; no eval script and no
  log parser ship with the rows.
- ``swe-smith`` (SWE-bench/SWE-smith): ``instance_id, repo, patch, FAIL_TO_PASS, PASS_TO_PASS,
  image_name, problem_statement`` (older revisions add ``created_at``, ``base_commit``). ``patch`` is
  the diff that *introduces* the bug (the repo's branch named after the instance already carries
  it), so there is no gold fix column; no ``test_patch``, ``version``, eval script or log parser.
- ``swe-bench-extra`` (nebius/SWE-bench-extra): the classic columns plus
  ``environment_setup_commit, meta{failed_lite_validators, has_test_patch, is_lite}`` with list-valued
  test columns; no image and no eval script.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

Row = dict[str, Any]
Adapted = tuple[Row, list[str]]

NO_EVAL_SCRIPT = ("no eval_script: swebench 5.x grades with the row's own eval script, and this "
                  "dataset ships none")


def derived_image(instance_id: str) -> str:
    """The image name swebench derives for an instance (the official Docker Hub images)."""
    from swebench.task.checks import expected_image  # lazy: swebench is heavy

    return expected_image(instance_id)


def swebench(row: Row) -> Adapted:
    row = dict(row)
    notes: list[str] = []
    if not row.get("image") and isinstance(row.get("instance_id"), str):
        row["image"] = derived_image(row["instance_id"])
        notes.append(f"image: not in the row; using the derived name {row['image']}")
    if not row.get("eval_script"):
        notes.append("no eval_script: a classic SWE-bench row; use a swebench 5.x export of the "
                     "dataset (with image, eval_script, log_parser, eval_type) to grade it here")
    return row, notes


def swe_gym(row: Row) -> Adapted:
    row = dict(row)
    notes = []
    iid = row.get("instance_id")
    if not row.get("image") and isinstance(iid, str):
        row["image"] = f"xingyaoww/sweb.eval.x86_64.{iid.replace('__', '_s_')}:latest"
        notes.append(f"image: SWE-Gym's published name {row['image']} (pull it where a registry is reachable)")
    if not row.get("eval_script"):
        notes.append(NO_EVAL_SCRIPT + " (SWE-Gym)")
    if not row.get("log_parser"):
        notes.append("no log_parser in SWE-Gym rows")
    return row, notes


def swe_smith(row: Row) -> Adapted:
    out = dict(row)
    notes = []
    iid = row.get("instance_id")
    out["bug_patch"] = row.get("patch") or ""
    out["patch"] = ""  # SWE-smith's patch introduces the bug; the fix is its reverse
    notes.append("no gold fix: SWE-smith's 'patch' introduces the bug (kept as 'bug_patch'; the fix is its reverse)")
    if row.get("image_name") and not row.get("image"):
        out["image"] = row["image_name"]
    if not row.get("base_commit") and isinstance(iid, str):
        out["base_commit"] = iid  # the mirror repo's branch that carries the bug
        notes.append("base_commit: not in the row; the bug lives on the mirror's branch named after the instance")
    out.setdefault("test_patch", "")
    out.setdefault("version", "")
    out.setdefault("hints_text", "")
    if not row.get("eval_script"):
        notes.append(NO_EVAL_SCRIPT + " (SWE-smith runs tests with its own repo profiles)")
    if not row.get("log_parser"):
        notes.append("no log_parser in SWE-smith rows")
    return out, notes


def swe_bench_extra(row: Row) -> Adapted:
    row = dict(row)
    notes = []
    meta = row.get("meta")
    if isinstance(meta, dict):
        row.pop("meta")
        for k, v in meta.items():
            row[f"meta_{k}"] = v
    if not row.get("image"):
        notes.append("no image: SWE-bench-extra publishes no per-instance images; build one from "
                     "environment_setup_commit (not automated here)")
    if not row.get("eval_script"):
        notes.append(NO_EVAL_SCRIPT + " (SWE-bench-extra)")
    return row, notes


ADAPTERS: dict[str, Callable[[Row], Adapted]] = {
    "swebench": swebench,
    "swe-gym": swe_gym,
    "swe-smith": swe_smith,
    "swe-bench-extra": swe_bench_extra,
}


def detect(row: Row) -> str:
    """Best guess of a row's schema (for ``tasks.adapter=auto``)."""
    if "image_name" in row and "test_patch" not in row:
        return "swe-smith"
    if isinstance(row.get("meta"), dict) and "environment_setup_commit" in row and not row.get("image"):
        return "swe-bench-extra"
    return "swebench"


def adapt(row: Row, name: str = "auto") -> Adapted:
    """``row`` mapped to the swebench 5.x shape by adapter ``name`` (or auto-detected)."""
    if name == "auto":
        name = detect(row) if isinstance(row, dict) else "swebench"
    if name not in ADAPTERS:
        raise ValueError(f"unknown adapter {name!r} (known: auto, {', '.join(ADAPTERS)})")
    if not isinstance(row, dict):
        return row, []
    return ADAPTERS[name](row)
