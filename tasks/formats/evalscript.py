"""Eval scripts in swebench's shape, for datasets that publish a test command but no script.

swebench 5.x grades a row with its own ``eval_script``: bash that sets up, prints
``>>>>> Start Test Output``, runs the tests, prints ``>>>>> End Test Output`` (``swebench.harness``
reads only what is between the markers, with the row's ``log_parser``). SWE-bench's HF exports ship
the script; SWE-Gym, SWE-smith, R2E-Gym and SWE-rebench ship a test command (per repo, per row or per
image) instead. ``eval_script(...)`` writes the script the way swebench 4.x's
``make_eval_script_list`` did for SWE-bench itself (the script the HF exports now carry):

    cd /testbed; <setup>; git checkout <base> -- <test files>; git apply <test_patch>
    : '>>>>> Start Test Output'; <test command> <directives>; : '>>>>> End Test Output'
    git checkout <base> -- <test files>

``test_files(test_patch)`` are the directives swebench gave pytest: the files the test patch touches,
less swebench's ``NON_TEST_EXTS``.
"""
from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

WORKDIR = "/testbed"
HEREDOC = "EOF_114329324912"  # swebench's delimiter for the test patch
CONDA = ("source /opt/miniconda3/bin/activate", "conda activate testbed")  # the swebench-style images
_DIFF_PATH = re.compile(r"^diff --git a/.* b/(.*)$", re.M)


def test_files(test_patch: str) -> list[str]:
    """The files ``test_patch`` touches, in order, without swebench's non-test extensions."""
    from swebench.harness.constants import NON_TEST_EXTS  # lazy: swebench is heavy

    seen: list[str] = []
    for path in _DIFF_PATH.findall(test_patch or ""):
        if path not in seen and not any(path.endswith(ext) for ext in NON_TEST_EXTS):
            seen.append(path)
    return seen


def eval_script(test_cmd: str | Sequence[str], *, base_commit: str | None = None, test_patch: str = "",
                directives: Sequence[str] = (), setup: Sequence[str] = (), teardown: Sequence[str] = ()) -> str:
    """The swebench-shaped bash script that runs ``test_cmd`` (its last line gets ``directives``)."""
    from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT  # lazy: swebench is heavy

    cmds = [test_cmd] if isinstance(test_cmd, str) else list(test_cmd)
    if not cmds or not all(isinstance(c, str) and c.strip() for c in cmds):
        raise ValueError(f"empty test command: {test_cmd!r}")
    if directives:
        cmds[-1] = " ".join([cmds[-1], *(shlex.quote(d) for d in directives)])
    touched = " ".join(shlex.quote(p) for p in _DIFF_PATH.findall(test_patch or ""))
    lines = ["#!/bin/bash", "set -uxo pipefail", f"cd {WORKDIR}", *setup,
             f"git config --global --add safe.directory {WORKDIR}"]
    if test_patch.strip():
        if not base_commit:
            raise ValueError("a test patch needs the base commit to reset its files to")
        lines += [f"git checkout {base_commit} -- {touched}",
                  f"git apply -v - <<'{HEREDOC}'\n{test_patch.rstrip(chr(10))}\n{HEREDOC}"]
    lines += [f": '{START_TEST_OUTPUT}'", *cmds, f": '{END_TEST_OUTPUT}'", *teardown]
    if test_patch.strip():
        lines.append(f"git checkout {base_commit} -- {touched}")
    return "\n".join(lines) + "\n"
