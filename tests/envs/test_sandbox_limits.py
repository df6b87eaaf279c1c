"""Host-resource limits of a sandbox, each attacked the way a reward-hacking policy would.

Disk fill, patch size, the file editor's size race (symlink swap), setuid and sparse files, a long
output line, host paths in errors, and the network setting (see docs/threats.md).
"""
from __future__ import annotations

import os
import time

import pytest


# -- network (unit) ---------------------------------------------------------------------------------
def test_network_other_than_none_needs_allow_network(caplog):
    from pydantic import ValidationError

    from sao_harness.envs.config import SandboxConfig

    assert SandboxConfig().network == "none"
    with pytest.raises(ValidationError, match="allow_network"):
        SandboxConfig(network="host")
    with caplog.at_level("WARNING"):
        assert SandboxConfig(network="host", allow_network=True).network == "host"
    assert "not isolated" in caplog.text


# -- long output line (unit: the SDK's line buffer) -------------------------------------------------
def _feed_one_line(n_bytes: int) -> tuple[float, str]:
    from sao_harness.harness.tools.target import SandboxTarget
    from sao_harness.harness.tools.terminal import DockerExecTerminal

    term = DockerExecTerminal(SandboxTarget("unused"))
    chunk = "a" * 4096  # the SDK reads the PTY 4096 bytes at a time
    t0 = time.perf_counter()
    for _ in range(n_bytes // len(chunk)):
        term._add_text_to_buffer(chunk)
    term._add_text_to_buffer("\nafter\n")
    return time.perf_counter() - t0, "".join(term.output_buffer)


def test_long_line_without_newline_costs_linear_time():
    from sao_harness.harness.tools.terminal import LINE_CUT_MARKER, MAX_LINE_CHARS

    t_small, _ = _feed_one_line(4 << 20)
    t_big, out = _feed_one_line(16 << 20)
    # quadratic: 4x the bytes cost 16x the time (16 MB took 64 s unguarded); linear: ~4x
    assert t_big / max(t_small, 1e-3) < 8, (t_small, t_big)
    assert out == "a" * MAX_LINE_CHARS + LINE_CUT_MARKER.format(n=MAX_LINE_CHARS) + "\nafter\n"


def test_normal_lines_are_buffered_as_the_sdk_does():
    from sao_harness.harness.tools.target import SandboxTarget
    from sao_harness.harness.tools.terminal import DockerExecTerminal

    term = DockerExecTerminal(SandboxTarget("unused"))
    for piece in ["ab", "c\r\nde", "f\n", "g"]:
        term._add_text_to_buffer(piece)
    assert list(term.output_buffer) == ["abc\n", "def\n", "g"]


# -- docker: disk -----------------------------------------------------------------------------------
@pytest.mark.docker
def test_single_file_over_disk_budget_fails_at_once(make_sandbox):
    sb = make_sandbox(disk_bytes="64m")
    r = sb.run("fallocate -l 1G /big; echo rc=$?; stat -c %s /big", 60)
    assert "rc=0" not in r.output and r.output.strip().endswith("0"), r.output  # EFBIG: nothing allocated
    from sao_harness.envs.limits import disk_usage

    assert disk_usage(sb.api, sb.container_id) < 64 << 20


@pytest.mark.docker
@pytest.mark.slow
def test_disk_fill_over_budget_is_stopped(make_sandbox, monkeypatch, capsys):
    """20 files of 32 MB, each under the file limit, 640 MB in all, against 128 MiB: refused by the kernel
    where the engine caps disks (the sandbox lives on), killed by the watchdog where it does not."""
    import sao_harness.envs.sandbox as sandbox_module
    from sao_harness.envs.limits import DiskLimitExceeded

    fill = "for i in $(seq 20); do head -c 32M /dev/zero > /fill$i || break; done"
    sb = make_sandbox(disk_bytes="128m", disk_check_s=0.25)
    if sb.disk_cap:
        r = sb.run(fill + "; sync; du -sm /fill* | awk '{s+=$1} END {print s}'", 60)
        assert "quota exceeded" in r.output.lower(), r.output
        assert int(r.output.split()[-1]) <= 128 and sb.run("true").exit_code == 0
        monkeypatch.setattr(sandbox_module, "hard_disk_cap", lambda *a: {})  # and the watchdog alone:
        sb = make_sandbox(disk_bytes="128m", disk_check_s=0.25)
    t0 = time.monotonic()
    with pytest.raises(DiskLimitExceeded):
        sb.run(fill + "; sleep 20", 60)
    took = time.monotonic() - t0
    assert sb.disk_exceeded is not None and sb.disk_exceeded < 640 << 20
    with pytest.raises(DiskLimitExceeded):
        sb.run("true")
    with capsys.disabled():
        print(f"\n[disk fill] the watchdog stopped it after {took:.2f} s with {sb.disk_exceeded / 2**20:.0f} MiB "
              f"on disk (budget 128 MiB)")


# -- docker: patch size -----------------------------------------------------------------------------
def _repo(sb) -> str:
    sb.run("git init -q /tmp/r && git -C /tmp/r -c user.email=a@b -c user.name=a commit -q --allow-empty -m base",
           60, check=True)
    return sb.run("git -C /tmp/r rev-parse HEAD", 30, check=True).output.strip()


@pytest.mark.docker
def test_patch_over_cap_is_patch_too_large_and_never_read_whole(make_sandbox, monkeypatch):
    from sao_harness.envs.limits import PatchTooLarge
    from sao_harness.envs.sandbox import Sandbox

    sb = make_sandbox(max_patch_bytes=100_000)
    base = _repo(sb)
    sb.run("echo hi > /tmp/r/small.txt", check=True)
    assert "+hi" in sb.diff(base, "/tmp/r")
    sb.run("head -c 8000000 /dev/urandom | base64 > /tmp/r/big.txt", 60, check=True)  # ~11 MB of patch
    read = []
    orig = Sandbox._read_bounded
    monkeypatch.setattr(Sandbox, "_read_bounded", lambda self, *a: read.append(orig(self, *a)) or read[-1])
    monkeypatch.setattr(Sandbox, "read_file", lambda *a: pytest.fail("the patch was read unbounded"))
    with pytest.raises(PatchTooLarge):
        sb.diff(base, "/tmp/r")
    assert [len(b) for b in read] == [100_001]
    assert sb.run("ls -a $(git -C /tmp/r rev-parse --absolute-git-dir) | grep -c sao-patch").output.strip() == "0"


def test_limit_statuses_are_zero_rewards_not_infra_errors():
    from sao_harness.harness.trace import Status, Trajectory

    Trajectory(task_id="t", status=Status.PATCH_TOO_LARGE, reward=0.0).validate()
    Trajectory(task_id="t", status=Status.DISK_EXCEEDED, reward=0.0).validate()


# -- docker: the file editor ------------------------------------------------------------------------
@pytest.fixture
def editor(sandbox):
    from sao_harness.harness.tools.file_editor import SandboxFileEditorExecutor
    from sao_harness.harness.tools.target import SandboxTarget

    ex = SandboxFileEditorExecutor(SandboxTarget.from_sandbox(sandbox))
    yield ex
    ex.close()


def _view(editor, path: str):
    from openhands.tools.file_editor.definition import FileEditorAction

    return editor(FileEditorAction(command="view", path=path))


@pytest.mark.docker
@pytest.mark.slow
def test_editor_size_race_symlink_swap_gets_at_most_the_limit(sandbox, editor):
    limit = editor.editor._max_file_size
    sandbox.run("echo small > /tmp/small.txt && head -c 40M /dev/zero | tr '\\0' a > /tmp/huge.txt && "
                "ln -sf /tmp/small.txt /tmp/f.txt", 60, check=True)
    # swap the symlink between the probe's stat and its read, as fast as the container can
    sandbox.run("(while :; do ln -sf /tmp/huge.txt /tmp/f.tmp && mv -T /tmp/f.tmp /tmp/f.txt; "
                "ln -sf /tmp/small.txt /tmp/f.tmp && mv -T /tmp/f.tmp /tmp/f.txt; done) >/dev/null 2>&1 &", 10)
    seen = []
    orig = editor._exec
    editor._exec = lambda argv: seen.append(len((r := orig(argv))[1])) or r
    for _ in range(40):
        obs = _view(editor, "/tmp/f.txt")
        assert "aaaaaaaa" not in obs.text or len(obs.text) < limit
    sandbox.kill_processes()
    assert max(seen) <= limit + 4096, max(seen)  # the probe's output: at most the limit + 1 and its headers


@pytest.mark.docker
def test_editor_host_copy_is_never_setuid(sandbox, editor):
    sandbox.run("printf 'x = 1\\n' > /tmp/s.py && chmod 6755 /tmp/s.py", check=True)
    host = editor.shadow + "/tmp/s.py"
    modes = []
    orig = editor.editor.__class__.__call__

    def spy(self, *a, **k):
        modes.append(os.stat(host).st_mode & 0o7777)
        return orig(self, *a, **k)

    editor.editor.__class__.__call__ = spy
    try:
        assert "x = 1" in _view(editor, "/tmp/s.py").text
    finally:
        editor.editor.__class__.__call__ = orig
    assert modes == [0o755]
    from openhands.tools.file_editor.definition import FileEditorAction

    obs = editor(FileEditorAction(command="str_replace", path="/tmp/s.py", old_str="x = 1", new_str="x = 2"))
    assert not obs.is_error, obs.text
    assert sandbox.run("stat -c %a /tmp/s.py; cat /tmp/s.py").output == "6755\nx = 2\n"  # the container's stays


@pytest.mark.docker
def test_editor_refuses_sparse_and_oversized_files_before_copying(sandbox, editor):
    # (5 TiB is over the sandbox's file-size limit now; 5 GiB is under it)
    sandbox.run("truncate -s 5G /tmp/sparse5g.txt && truncate -s 5M /tmp/sparse5m.txt && "
                "head -c 11M /dev/zero | tr '\\0' a > /tmp/big.txt", 60, check=True)
    for path, size in (("/tmp/sparse5g.txt", "5120.0MB"), ("/tmp/big.txt", "11.0MB")):
        obs = _view(editor, path)
        assert obs.is_error and obs.text.startswith(f"File validation failed for {path}: File is too large ({size}")
        assert os.stat(editor.shadow + path).st_size <= editor.editor._max_file_size + 1
    obs = _view(editor, "/tmp/sparse5m.txt")
    assert obs.is_error and "sparse" in obs.text and "File is too large" in obs.text


@pytest.mark.docker
def test_agent_visible_errors_never_show_host_paths(sandbox, editor):
    from openhands.tools.file_editor.definition import FileEditorAction

    sandbox.run("mkdir -p /tmp/d && printf 'a\\n' > /tmp/d/f.txt", check=True)
    actions = [FileEditorAction(command="view", path="/tmp/a\0b"),
               FileEditorAction(command="view", path="relative/path"),
               FileEditorAction(command="view", path="/nonexistent/file"),
               FileEditorAction(command="create", path="/tmp/d", file_text="x"),
               FileEditorAction(command="undo_edit", path="/tmp/d/f.txt"),
               FileEditorAction(command="str_replace", path="/tmp/d/f.txt", old_str="zz", new_str="y"),
               FileEditorAction(command="insert", path="/tmp/d/f.txt", insert_line=99, new_str="y"),
               FileEditorAction(command="view", path="/tmp/d", view_range=[1, 2])]
    for action in actions:
        obs = editor(action)
        text = obs.text + str(obs.path) + "".join(getattr(c, "text", "") for c in obs.content)
        assert editor.shadow not in text and "sao-fe-" not in text, (action.command, action.path, text)
