"""Adapters: a row of any public SWE training set -> a swebench 5.x row, gradable where the data allows.

``adapt(row, name)`` returns ``(row, notes, name)``; ``name="auto"`` picks the adapter from the
columns (``detect``; a row of no known format is ``UnknownFormat``, naming each format's columns:
``COLUMNS``). What grading needs (``image, eval_script, log_parser, eval_type``) comes from
each project's own conventions; a note that starts with ``"<field>: "`` says why that field could not
be made (``Task.grading_gaps`` shows it). Per format (columns as the HF datasets publish them):

- ``swebench``: SWE-bench / Lite / Verified / Multilingual. Today's exports carry ``image,
  eval_script, log_parser, eval_type`` (made by swebench's own harness): passed through. Classic
  13-column copies (princeton-nlp/...) have no script and swebench 5.x no longer ships the per-repo
  specs that made one, so they stay ungradable; their image is the name swebench derives.
- ``swe-gym`` (SWE-Gym/SWE-Gym, -Lite): SWE-bench columns without ``environment_setup_commit``, list
  test columns. Test command per repo from SWE-Gym's harness (``tasks.formats.specs.SWE_GYM``), swebench's
  ``parse_log_pytest``; image ``xingyaoww/sweb.eval.x86_64.<id, __ -> _s_>`` (lowercase, as OpenHands
  pulls it).
- ``swe-smith`` (SWE-bench/SWE-smith): ``instance_id = owner__repo.commit8.<bug>``, ``patch`` is the
  diff that introduces the bug (kept as ``bug_patch``; the gold patch is its reverse), no test patch.
  Test command from its repo profile (``tasks.formats.specs.swe_smith_test_cmd``) with ``-rA`` for
  ``parse_log_pytest``; image ``jyangballin/swesmith.x86_64.<owner>_1776_<repo>.<commit8>``.
- ``r2e-gym`` (R2E-Gym/R2E-Gym-Lite, -Subset, -V1): ``repo_name, docker_image, commit_hash,
  parsed_commit_content, execution_result_content, expected_output_json``, no ``instance_id`` (made
  as ``<repo_name>__<commit_hash[:12]>``). The image's ``run_tests.sh`` runs the held-out
  ``/r2e_tests``; test ids are R2E's (``Class.test``), FAIL_TO_PASS / PASS_TO_PASS from the
  recorded pre-fix run; ``episode_setup`` moves the tests and their runner out of the agent's repo,
  as R2E-Gym does.
- ``swe-rebench`` (nebius/SWE-rebench, -leaderboard, -V2): ``install_config`` (``test_cmd``,
  ``log_parser``), ``docker_image``; FAIL_TO_FAIL / PASS_TO_FAIL kept as extra columns.
- ``swe-bench-extra`` (nebius/SWE-bench-extra): classic columns plus ``meta``; no image: ungradable.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from sao_harness.core.errors import UserError
from sao_harness.tasks.formats import specs
from sao_harness.tasks.formats.evalscript import CONDA, eval_script, test_files

Row = dict[str, Any]
Adapted = tuple[Row, list[str]]

PASS_AND_FAIL = "pass_and_fail"


def derived_image(instance_id: str, namespace: str = "swebench") -> str:
    """The image name swebench derives for an instance (``<ns>/sweb.eval.x86_64.<id>:latest``)."""
    from swebench.task.checks import expected_image  # lazy: swebench is heavy

    return expected_image(instance_id, namespace)


def _tests(value) -> list | None:
    """A test column as a list (JSON text or list), None when it is neither."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    if hasattr(value, "tolist"):
        value = value.tolist()
    return list(value) if isinstance(value, (list, tuple)) else None


def _json_field(row: Row, name: str) -> Any:
    value = row.get(name)
    if isinstance(value, str) and value.strip()[:1] in ("{", "["):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return None
    return value


def _grading(row: Row, script: str, parser: str = "parse_log_pytest") -> None:
    row.update(eval_script=script, log_parser=parser, eval_type=PASS_AND_FAIL)


# --- SWE-bench (and swebench 5.x task repos) ---------------------------------------------
def swebench(row: Row) -> Adapted:
    row = dict(row)
    notes: list[str] = []
    if not row.get("image") and isinstance(row.get("instance_id"), str):
        row["image"] = derived_image(row["instance_id"])
    if not row.get("eval_script"):
        notes.append("eval_script: a classic SWE-bench row; swebench 5.x grades with the row's own script (and "
                     "ships no per-repo specs to make one): use today's HF export, which carries it")
    return row, notes


# --- SWE-Gym ---------------------------------------------------------------------------------
def swe_gym_image(instance_id: str) -> str:
    """SWE-Gym's published image (OpenHands' naming): lowercase, ``__`` -> ``_s_``, no tag."""
    return f"xingyaoww/sweb.eval.x86_64.{instance_id.replace('__', '_s_')}".lower()


def swe_gym(row: Row) -> Adapted:
    row = dict(row)
    notes: list[str] = []
    iid, repo = row.get("instance_id"), row.get("repo")
    if not row.get("image") and isinstance(iid, str):
        row["image"] = swe_gym_image(iid)
    if not row.get("eval_script") and isinstance(repo, str):
        spec = specs.SWE_GYM.get(repo.lower())
        if spec is None:
            notes.append(f"eval_script: SWE-Gym's harness has no test command for repo {repo} "
                         f"(it covers {', '.join(sorted(specs.SWE_GYM))})")
        else:
            tests = (_tests(row.get("FAIL_TO_PASS")) or []) + (_tests(row.get("PASS_TO_PASS")) or [])
            directives = (specs.mypy_k_expression(tests) if spec.get("k") else
                          test_files(row.get("test_patch") or ""))
            cmd = spec.get("versions", {}).get(str(row.get("version")), spec["test_cmd"])
            _grading(row, eval_script(cmd, base_commit=row.get("base_commit"),
                                      test_patch=row.get("test_patch") or "", directives=directives,
                                      setup=[*CONDA, *spec.get("eval_commands", ())]))
    return row, notes


# --- SWE-smith -------------------------------------------------------------------------------
_SMITH_IMAGE = re.compile(r"^(?:(?P<org>[^/]+)/)?swesmith\.(?P<arch>[^.]+)\.(?P<name>.+)$")


def swe_smith_image(image_name: str) -> str:
    """The published name of a SWE-smith image: org ``jyangballin`` where the row names none, and the
    ``owner_1776_repo`` form (older rows write ``owner__repo``); lowercase."""
    m = _SMITH_IMAGE.match(image_name)
    if m is None:
        return image_name
    return f"{m['org'] or specs.SWE_SMITH_ORG}/swesmith.{m['arch']}.{m['name'].replace('__', '_1776_')}".lower()


def reverse_patch(diff: str) -> str | None:
    """The diff that undoes ``diff`` (file modifications only; None when it adds, removes or renames)."""
    from unidiff import PatchSet  # lazy: only SWE-smith rows need it

    files = PatchSet(diff)
    if not files or any(f.is_added_file or f.is_removed_file or f.is_rename for f in files):
        return None
    out = []
    for f in files:
        out += [f"diff --git a/{f.path} b/{f.path}", f"--- a/{f.path}", f"+++ b/{f.path}"]
        for h in f:
            header = f" {h.section_header}" if h.section_header else ""
            out.append(f"@@ -{h.target_start},{h.target_length} +{h.source_start},{h.source_length} @@{header}")
            for line in h:
                kind = {"+": "-", "-": "+"}.get(line.line_type, line.line_type)
                out.append("\\ No newline at end of file" if kind == "\\" else kind + line.value.rstrip("\n"))
    return "\n".join(out) + "\n"


def swe_smith(row: Row) -> Adapted:
    out = dict(row)
    notes = ["patch: SWE-smith's 'patch' introduces the bug (kept as 'bug_patch'; the gold fix is its reverse); "
             "the image must hold the bug at base_commit, as SWE-smith's harness arranges by checking out the "
             "instance's branch"]
    iid = row.get("instance_id")
    out["bug_patch"] = row.get("patch") or ""
    out["patch"] = (reverse_patch(out["bug_patch"]) or "") if out["bug_patch"].strip() else ""
    if not row.get("image"):
        name = row.get("image_name")
        if not name and isinstance(iid, str) and "." in iid:
            name = f"swesmith.x86_64.{iid.rsplit('.', 1)[0]}"
        if name:
            out["image"] = swe_smith_image(name)
    if not row.get("base_commit") and isinstance(iid, str):
        out["base_commit"] = iid  # SWE-smith's branch named after the instance carries the bug
    out.setdefault("test_patch", "")
    out.setdefault("version", "")
    out.setdefault("hints_text", "")
    if not row.get("eval_script"):
        profile = str(row.get("repo") or (iid or "").rsplit(".", 1)[0]).removeprefix("swesmith/")
        tests = (_tests(row.get("FAIL_TO_PASS")) or []) + (_tests(row.get("PASS_TO_PASS")) or [])
        cmd, why = specs.swe_smith_test_cmd(profile, tests)
        if cmd is None:
            notes.append(f"eval_script: {why}")
        else:
            _grading(out, eval_script(cmd, setup=CONDA))
    return out, notes


# --- R2E-Gym ---------------------------------------------------------------------------------
R2E_STATUS = "PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS"
# pytest's -rA summary ("PASSED r2e_tests/test_1.py::Class::test") -> R2E's key ("PASSED Class.test"):
# what R2E-Gym's log parser does, in the log itself, so swebench's parse_log_pytest reads R2E's ids
R2E_RENAME = (f"sed -E -e 's/^({R2E_STATUS}) [^ ]*\\.py::/\\1 /' "
              f"-e ':a' -e 's/^(({R2E_STATUS}) [^ ]*)::/\\1./' -e 'ta'")
R2E_TEST_CMD = f"bash run_tests.sh 2>&1 | {R2E_RENAME}"
R2E_TESTS, R2E_LINK = "/r2e_tests", "r2e_tests"  # the held-out tests in the image; their name in the repo
R2E_LINK_CMD = f"ln -s {R2E_TESTS} {R2E_LINK}"  # how the grading container finds them (tasks.grading.clean_run too)
R2E_EVAL_SETUP = ["git checkout -q HEAD -- run_tests.sh 2>/dev/null || true", f"rm -rf {R2E_LINK}", R2E_LINK_CMD]
# what R2E-Gym's runtime does before the agent starts: the held-out tests and their runner out of the repo
R2E_EPISODE_SETUP = ("if [ -d /r2e_tests ]; then mv /r2e_tests /root/r2e_tests; fi; "
                     "if [ -f /testbed/run_tests.sh ]; then mv /testbed/run_tests.sh /root/run_tests.sh; fi")


def r2e_key(node_id: str) -> str:
    """R2E-Gym's id of a pytest test: the node id without its file, ``::`` -> ``.``."""
    return ".".join(node_id.split(" - ")[0].split("::")[1:]) or node_id


def r2e_statuses(log: str) -> dict[str, str]:
    """Test statuses of a recorded R2E-Gym run (pytest ``-rA``), by R2E id, via swebench's parser."""
    from swebench.harness.log_parsers import PARSER_REGISTRY  # lazy: swebench is heavy

    return {r2e_key(k): v for k, v in PARSER_REGISTRY["parse_log_pytest"](log or "", None).items()}


def r2e_gym(row: Row) -> Adapted:
    out = dict(row)
    notes: list[str] = []
    name, commit = row.get("repo_name"), row.get("commit_hash") or row.get("git_commit_hash")
    if not out.get("instance_id") and isinstance(name, str) and isinstance(commit, str):
        out["instance_id"] = f"{name}__{commit[:12]}"
    out.setdefault("repo", name)
    out.setdefault("image", row.get("docker_image"))
    parsed = _json_field(row, "parsed_commit_content")
    old = parsed.get("old_commit_hash") if isinstance(parsed, dict) else None
    out.setdefault("base_commit", old or "HEAD")
    if not old:
        notes.append("base_commit: parsed_commit_content names no old_commit_hash; using the image's HEAD")
    ps = row.get("problem_statement")
    if isinstance(ps, str) and (m := re.search(r"\[ISSUE\](.*)\[/ISSUE\]", ps, re.S)):
        out["problem_statement"] = m.group(1).strip()
    expected = _json_field(row, "expected_output_json")
    execution = _json_field(row, "execution_result_content")
    if out.get("FAIL_TO_PASS") is None:
        if not isinstance(expected, dict) or not expected:
            notes.append("FAIL_TO_PASS: no expected_output_json to take the tests from")
        else:
            want = {k.split(" - ")[0]: v for k, v in expected.items()}
            passing = [k for k, v in want.items() if v == "PASSED"]
            before = r2e_statuses(execution.get("old_commit_res_stdout")) if isinstance(execution, dict) else {}
            if before:
                out["FAIL_TO_PASS"] = [k for k in passing if before.get(k) != "PASSED"]
                out["PASS_TO_PASS"] = [k for k in passing if before.get(k) == "PASSED"]
            else:
                out["FAIL_TO_PASS"], out["PASS_TO_PASS"] = passing, []
                notes.append("FAIL_TO_PASS: no pre-fix run in execution_result_content: every test "
                             "expected to pass is in FAIL_TO_PASS")
    for k in ("patch", "test_patch", "version", "hints_text"):
        out.setdefault(k, "")
    notes.append("patch: R2E-Gym's fix is in parsed_commit_content (not converted to a diff here)")
    if not out.get("eval_script"):
        # the held-out tests live in /r2e_tests; run_tests.sh runs them from the repo as r2e_tests/. The
        # patch cannot bring its own: the image's run_tests.sh is restored, r2e_tests/ replaced by the link
        _grading(out, eval_script(R2E_TEST_CMD, setup=R2E_EVAL_SETUP, teardown=["rm -f r2e_tests"]))
    out.setdefault("episode_setup", R2E_EPISODE_SETUP)
    return out, notes


# --- SWE-rebench -----------------------------------------------------------------------------
def swe_rebench(row: Row) -> Adapted:
    out = dict(row)
    notes: list[str] = []
    iid = row.get("instance_id")
    if not out.get("image"):
        out["image"] = row.get("docker_image") or row.get("image_name") or (
            derived_image(iid, "swerebench").removesuffix(":latest") if isinstance(iid, str) else None)
    meta = _json_field(row, "meta")
    if isinstance(meta, dict):
        out.pop("meta")
        out.update({f"meta_{k}": v for k, v in meta.items()})
    config = _json_field(row, "install_config")
    if not isinstance(config, dict):
        notes.append("eval_script: no install_config (SWE-rebench's test command and log parser live there)")
        return out, notes
    out["install_config"] = config
    parser = config.get("log_parser") or "parse_log_pytest"
    cmd = config.get("test_cmd")
    if not cmd:
        if parser != "parse_log_pytest":
            notes.append(f"eval_script: install_config has no test_cmd (log parser {parser})")
            return out, notes
        cmd = specs.SWEBENCH_PYTEST
        notes.append(f"eval_script: install_config has no test_cmd; using swebench's pytest command ({cmd})")
    if not out.get("eval_script"):
        test_patch = row.get("test_patch") or ""
        setup = [*CONDA, *[f"export {k}={json.dumps(str(v))}" for k, v in (config.get("env_vars") or {}).items()]]
        _grading(out, eval_script(cmd, base_commit=row.get("base_commit"), test_patch=test_patch,
                                  directives=test_files(test_patch), setup=setup), parser)
    return out, notes


# --- SWE-bench-extra ---------------------------------------------------------------------------
def swe_bench_extra(row: Row) -> Adapted:
    row = dict(row)
    notes = []
    meta = row.get("meta")
    if isinstance(meta, dict):
        row.pop("meta")
        row.update({f"meta_{k}": v for k, v in meta.items()})
    if not row.get("image"):
        notes.append("image: SWE-bench-extra publishes no per-instance images (its successor SWE-rebench does)")
    if not row.get("eval_script"):
        notes.append("eval_script: SWE-bench-extra rows carry no test command (SWE-rebench's install_config does)")
    return row, notes


ADAPTERS: dict[str, Callable[[Row], Adapted]] = {
    "swebench": swebench,
    "swe-gym": swe_gym,
    "swe-smith": swe_smith,
    "r2e-gym": r2e_gym,
    "swe-rebench": swe_rebench,
    "swe-bench-extra": swe_bench_extra,
}


# The columns a row of each format needs (what ``detect`` tells them apart by; the ``UnknownFormat`` message).
COLUMNS: dict[str, str] = {
    "swebench": "instance_id, repo, base_commit, problem_statement, patch, test_patch, FAIL_TO_PASS, "
                "PASS_TO_PASS; gradable with image, eval_script, log_parser, eval_type",
    "swe-gym": "swebench's, without environment_setup_commit, a repo SWE-Gym's harness covers",
    "swe-smith": "instance_id (owner__repo.commit8.bug), image_name, patch (the bug), FAIL_TO_PASS, PASS_TO_PASS",
    "r2e-gym": "repo_name, commit_hash, docker_image, parsed_commit_content, execution_result_content, "
               "expected_output_json; no instance_id",
    "swe-rebench": "swebench's, with install_config (test_cmd, log_parser) and docker_image",
    "swe-bench-extra": "swebench's, with environment_setup_commit and meta; no image",
}

class UnknownFormat(UserError):
    """A row ``tasks.adapter: auto`` cannot place: the message lists its columns and each format's (``COLUMNS``)."""

    def __init__(self, row: Row):
        columns = ", ".join(sorted(map(str, row))) or "none"
        known = " | ".join(f"{name}: {cols}" for name, cols in COLUMNS.items())
        super().__init__(f"a row of no known dataset format (its columns: {columns}); the formats "
                         f"tasks.adapter: auto knows, and the columns each needs: {known}")


def detect(row: Row) -> str:
    """The adapter for a row, from its columns (``tasks.adapter=auto``); ``UnknownFormat`` when no format's
    rules match and it has none of SWE-bench's identifying columns (a SWE-bench row missing some is
    ``swebench``'s, so that ``Task.from_row`` names the missing field)."""
    if "repo_name" in row and ("docker_image" in row or "expected_output_json" in row) and "instance_id" not in row:
        return "r2e-gym"
    if row.get("eval_script"):
        return "swebench"
    if "install_config" in row or str(row.get("docker_image") or "").startswith("swerebench/"):
        return "swe-rebench"
    if "image_name" in row and ("test_patch" not in row or str(row.get("repo", "")).startswith("swesmith/")):
        return "swe-smith"
    if isinstance(row.get("meta"), dict) and "environment_setup_commit" in row and not row.get("image"):
        return "swe-bench-extra"
    if "environment_setup_commit" not in row and str(row.get("repo", "")).lower() in specs.SWE_GYM:
        return "swe-gym"
    if not {"instance_id", "repo", "base_commit", "problem_statement"} & row.keys():
        raise UnknownFormat(row)
    return "swebench"


def adapt(row: Row, name: str = "auto") -> tuple[Row, list[str], str]:
    """``row`` in the swebench 5.x shape by adapter ``name`` (``auto``: ``detect``), its notes, the adapter."""
    if name != "auto" and name not in ADAPTERS:
        raise ValueError(f"unknown adapter {name!r} (known: auto, {', '.join(ADAPTERS)})")
    if not isinstance(row, dict):
        return row, [], name
    if name == "auto":
        name = detect(row)
    mapped, notes = ADAPTERS[name](row)
    return mapped, notes, name
