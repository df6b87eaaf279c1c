"""The clean run: the graded tests, run by the harness itself, read from a JUnit report.

``clean_run(task, patch, client=, limits=, timeout_s=, log_dir=) -> CleanResult`` in a fresh,
hardened container from the task image (``tasks.grade_sandbox``):
1. the patch is applied (swebench's own apply commands, in its order);
2. the task's eval script runs with its test command replaced: its preamble resets the test files
   to the task's versions and applies the test patch over them; then the files of the FAIL_TO_PASS /
   PASS_TO_PASS tests run under ``python3 -P`` (the working directory does not shadow modules;
   the repository is appended to ``sys.path``, after the installed packages) with
   ``--junitxml`` to a random path outside the repository that the patch cannot know in advance;
3. the report is read back with a bounded read (``JUNIT_MAX_BYTES``), parsed on the host with
   ``xml.etree`` (no DTD, no entities) and every graded test must have passed (an xfail counts as a
   pass, as in swebench's log parser).
Status: resolved | unresolved | patch_does_not_apply | infra_failure (Docker trouble, a timeout
before the tests started); output over ``limits.output_cap_bytes`` is unresolved with ``over_cap``, and
tests that run past the timeout are unresolved. Pytest tasks only.
"""
from __future__ import annotations

import io
import re
import secrets
import shlex
import tarfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from tasks.grade_sandbox import OWNER_LABEL, GradeLimits, hardened_kwargs, run_capped, tests_started

JUNIT_MAX_BYTES = 4_000_000
WORKDIR = "/testbed"
BOOTSTRAP = ("import sys; sys.path.append({workdir!r}); import pytest; sys.argv[0] = 'pytest'; "
             "raise SystemExit(pytest.main())")


@dataclass
class CleanResult:
    status: str  # resolved | unresolved | patch_does_not_apply | infra_failure
    tests_status: dict = field(default_factory=dict)  # {"FAIL_TO_PASS": {"success": [], "failure": []}, ...}
    over_cap: bool = False
    error: str = ""
    log_dir: str | None = None
    seconds: float = 0.0


def junit_key(nodeid: str) -> tuple[str, str]:
    """(classname, name) pytest's junitxml writes for ``nodeid`` (its ``mangle_test_address``)."""
    path, bracket, params = nodeid.partition("[")
    names = path.split("::")
    names[0] = re.sub(r"\.py$", "", names[0].replace("/", "."))
    names[-1] += bracket + params
    return ".".join(names[:-1]), names[-1]


def parse_junit(data: bytes) -> dict[tuple[str, str], bool]:
    """{(classname, name): passed} of a JUnit XML report; ValueError when it is not one."""
    if len(data) > JUNIT_MAX_BYTES:
        raise ValueError(f"JUnit report over {JUNIT_MAX_BYTES} bytes")
    if b"<!DOCTYPE" in data or b"<!ENTITY" in data:
        raise ValueError("JUnit report with a DTD or entities")
    root = ET.fromstring(data)
    out: dict[tuple[str, str], bool] = {}
    for case in root.iter("testcase"):
        key = (case.get("classname", ""), case.get("name", ""))
        bad = any(child.tag in ("failure", "error") for child in case)
        skipped = [c for c in case if c.tag == "skipped"]
        ok = not bad and all(c.get("type") == "pytest.xfail" for c in skipped)
        out[key] = out.get(key, True) and ok
    return out


def test_command(task, junit_path: str) -> str:
    """The replacement test command: the graded tests' files, ``-P``, the JUnit report."""
    files = list(dict.fromkeys(t.split("::", 1)[0] for t in task.FAIL_TO_PASS + task.PASS_TO_PASS))
    boot = BOOTSTRAP.format(workdir=WORKDIR)
    return (f"mkdir -p -m 700 {shlex.quote(str(Path(junit_path).parent))}\n"
            f"python3 -P -c {shlex.quote(boot)} -rA -p no:cacheprovider -o junit_family=xunit2 "
            f"-o junit_logging=no --junitxml={shlex.quote(junit_path)} {' '.join(map(shlex.quote, files))}")


def clean_script(eval_script: str, command: str) -> str:
    """``eval_script`` with the lines between swebench's test-output markers replaced by ``command``."""
    # lazy: swebench is heavy
    from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT

    lines = eval_script.splitlines()
    start = next((i for i, ln in enumerate(lines) if START_TEST_OUTPUT in ln), None)
    end = next((i for i, ln in enumerate(lines) if END_TEST_OUTPUT in ln), None)
    if start is None or end is None or end < start:
        raise ValueError("the eval script has no test-output markers")
    return "\n".join(lines[:start + 1] + [command] + lines[end:]) + "\n"


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o600, time.time()
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _read_file(container, path: str, limit: int) -> bytes | None:
    """Bytes of ``path`` in ``container`` (None if missing); ValueError past ``limit`` bytes."""
    import docker  # lazy: docker-py is heavy

    try:
        stream, stat = container.client.api.get_archive(container.id, path)
    except docker.errors.NotFound:
        return None
    if int(stat.get("size", 0)) > limit:
        raise ValueError(f"{path}: {stat.get('size')} bytes, over the {limit}-byte limit")
    blob = bytearray()
    for chunk in stream:
        blob += chunk
        if len(blob) > limit + 64 * 1024:
            raise ValueError(f"{path}: archive over the {limit}-byte limit")
    with tarfile.open(fileobj=io.BytesIO(bytes(blob))) as tar:
        member = tar.next()
        if member is None or not member.isfile():
            return None
        f = tar.extractfile(member)
        return f.read(limit + 1) if f else None


def _apply_patch(container, patch_file: str) -> bool:
    from swebench.harness.run_evaluation import GIT_APPLY_CMDS  # lazy: swebench is heavy

    for attempt, cmd in enumerate(GIT_APPLY_CMDS):
        if attempt:
            container.exec_run(["bash", "-c", "git checkout -- . ; git clean -fdq"], workdir=WORKDIR, user="root")
        if container.exec_run(f"{cmd} {patch_file}", workdir=WORKDIR, user="root").exit_code == 0:
            return True
    return container.exec_run(f"git apply --check --reverse {patch_file}", workdir=WORKDIR,
                              user="root").exit_code == 0


def clean_run(task, patch: str, *, client, limits: GradeLimits, timeout_s: float,
              log_dir: Path | str | None = None, name: str = "") -> CleanResult:
    """See the module doc."""
    t0 = time.monotonic()
    stage = f"/tmp/sao-stage-{secrets.token_hex(8)}"
    junit = f"/tmp/sao-{secrets.token_hex(16)}/{secrets.token_hex(8)}.xml"
    script = clean_script(task.test_spec().eval_script, test_command(task, junit))
    out_dir = Path(log_dir) if log_dir else None
    container, data = None, None
    try:
        container = client.containers.create(
            task.image, command=["tail", "-f", "/dev/null"], user="root", working_dir=WORKDIR, detach=True,
            name=name or f"sao-clean.{task.instance_id.lower()}.{secrets.token_hex(4)}",
            labels={OWNER_LABEL: "grade"}, **hardened_kwargs(limits, client))
        container.start()
        container.client.api.put_archive(container.id, "/", _tar({
            stage.lstrip("/") + "/patch.diff": patch.encode("utf-8"),
            stage.lstrip("/") + "/eval.sh": script.encode("utf-8")}))
        if not _apply_patch(container, f"{stage}/patch.diff"):
            return CleanResult("patch_does_not_apply", error="clean run: the patch does not apply",
                               seconds=time.monotonic() - t0)
        run = run_capped(container, ["bash", f"{stage}/eval.sh"], timeout_s=timeout_s,
                         cap_bytes=limits.output_cap_bytes, workdir=WORKDIR)
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "clean_output.txt").write_bytes(run.output)
        if run.over_cap:
            return CleanResult("unresolved", over_cap=True, log_dir=str(out_dir) if out_dir else None,
                               error=f"clean run: test output over the cap of {limits.output_cap_bytes} bytes",
                               seconds=time.monotonic() - t0)
        if run.timed_out and tests_started(run.output):  # the patch's code ran past the limit
            return CleanResult("unresolved", error=f"clean run: the tests ran past the timeout of {timeout_s:g} s "
                               "(a patch failure)", seconds=time.monotonic() - t0)
        if run.timed_out:
            return CleanResult("infra_failure", error=f"clean run: eval script timed out after {timeout_s:g} s "
                               "before its tests started", seconds=time.monotonic() - t0)
        try:
            data = _read_file(container, junit, JUNIT_MAX_BYTES)
            outcomes = parse_junit(data) if data is not None else {}
            why = "" if data is not None else "clean run: no JUnit report was written"
        except (ValueError, ET.ParseError, tarfile.TarError) as e:
            outcomes, why = {}, f"clean run: JUnit report rejected: {e}"
        if out_dir is not None and data is not None:
            (out_dir / "junit.xml").write_bytes(data[:JUNIT_MAX_BYTES])
    except Exception as e:  # Docker trouble: no verdict
        return CleanResult("infra_failure", error=f"clean run: {type(e).__name__}: {e}", seconds=time.monotonic() - t0)
    finally:
        if container is not None:
            try:
                container.remove(force=True)
            except Exception:  # gone already; the gc finds leftovers by label
                pass
    status = {}
    for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        tests = getattr(task, key)
        ok = [t for t in tests if outcomes.get(junit_key(t)) is True]
        status[key] = {"success": ok, "failure": [t for t in tests if t not in ok]}
    resolved = not status["FAIL_TO_PASS"]["failure"] and not status["PASS_TO_PASS"]["failure"]
    return CleanResult("resolved" if resolved else "unresolved", status, error=why,
                       log_dir=str(out_dir) if out_dir else None, seconds=time.monotonic() - t0)
