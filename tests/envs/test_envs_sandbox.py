"""Sandboxes against the real engine: hardening, the persistent shell, faults, files, patches."""
from __future__ import annotations

import os
import subprocess
import threading
import time

import pytest

from sao_harness.envs.sandbox import KEEPALIVE

pytestmark = pytest.mark.docker


# -- hardening ------------------------------------------------------------------------------------
def test_inside_no_network_no_caps_no_socket_no_host_processes(sandbox):
    r = sandbox.run("ls /sys/class/net; grep CapEff /proc/self/status; "
                    "ls /var/run/docker.sock /run/docker.sock 2>&1; ps -e -o comm= | sort -u")
    lines = r.output.split("\n")
    assert lines[0] == "lo"
    assert "CapEff:\t0000000000000000" in r.output
    assert r.output.count("No such file or directory") == 2
    procs = set(lines[4:])  # command names of every process the sandbox can see
    assert procs - {"", "bash", "sleep", "ps", "sort"} == set(), procs
    # host processes (e.g. dockerd, this pytest) are not visible
    assert "dockerd" not in r.output and "pytest" not in r.output


def test_the_agent_cannot_stop_its_container_and_orphans_are_reaped(sandbox):
    """Root in its sandbox, a failing agent tries to end the container (an infra error would leave its
    failure out of training and of resolved@1): PID 1 ignores every signal sent from inside, a killed
    keep-alive sleep is restarted, and the orphans PID 1 adopts are reaped (no zombie eats the pids)."""
    # the signals act at once (a PID 1 that died takes this shell with it); the loop restarts sleep at once
    r = sandbox.run("kill -9 1; kill -TERM 1; kill -INT 1; kill -STOP 1; pkill -9 -x sleep; kill -9 -1; "
                    "sleep 0.2; echo alive", 30)
    assert r.output.strip().endswith("alive") and sandbox.state()["Status"] == "running"
    assert sandbox.run("sleep 0.2; ps -eo comm= | grep -cx sleep", 30).output.strip().splitlines()[-1] == "1"
    # 0.4 s after the last orphan's exit: an init that never reaps leaves all 20 as zombies by then
    r = sandbox.run("for i in $(seq 20); do (sleep 0.1 &); done; sleep 0.5; ps -eo stat= | grep -c '^Z'", 30)
    assert r.output.strip().splitlines()[-1] == "0", r.output


def test_limits_labels_and_security_options(sandbox, test_run_id):
    attrs = sandbox.client.api.inspect_container(sandbox.container_id)
    hc = attrs["HostConfig"]
    assert hc["NetworkMode"] == "none"
    assert hc["Memory"] == 256 * 1024 * 1024 and hc["MemorySwap"] == hc["Memory"]
    assert hc["PidsLimit"] == 128 and hc["NanoCpus"] == 1_000_000_000
    assert hc["CapDrop"] == ["ALL"] and "no-new-privileges" in hc["SecurityOpt"]
    assert not hc["Init"] and not hc["Privileged"]  # PID 1 is KEEPALIVE, not docker-init
    assert attrs["Config"]["Entrypoint"] == ["bash", "-c", KEEPALIVE]
    labels = attrs["Config"]["Labels"]
    assert labels["sao-harness.owner"] == "sao-harness"
    assert labels["sao-harness.run-id"] == test_run_id
    assert labels["sao-harness.created-at"] and labels["sao-harness.pid"] == str(os.getpid())


def test_cap_add_is_configurable(make_sandbox):
    sb = make_sandbox(cap_add=["CHOWN", "cap_fowner"])
    out = sb.run("grep CapEff /proc/self/status").output
    assert "0000000000000000" not in out
    assert sorted(sb.client.api.inspect_container(sb.container_id)["HostConfig"]["CapAdd"]) == ["CHOWN", "FOWNER"]


def test_read_only_root_with_writable_workdir_and_tmp(make_sandbox):
    sb = make_sandbox(read_only=True)
    assert sb.run("touch /etc/x").exit_code != 0
    assert sb.run("touch /tmp/x && touch x && ls x").output == "x\n"
    assert sb.volume is not None
    sb.write_file("f.txt", "hi")
    assert sb.read_file("f.txt") == b"hi"
    name = sb.volume.name
    sb.close()
    assert not [v for v in sb.client.volumes.list() if v.name == name]


# -- the persistent shell -------------------------------------------------------------------------
def test_cwd_env_functions_persist_and_exit_codes(sandbox):
    assert sandbox.run("pwd").output == "/testbed\n"
    assert sandbox.run("mkdir -p /tmp/a && cd /tmp/a && export FOO=bar && f() { echo fn$1; }").exit_code == 0
    r = sandbox.run("pwd; echo $FOO; f 1")
    assert r.output == "/tmp/a\nbar\nfn1\n" and r.exit_code == 0 and r.cwd == "/tmp/a"
    assert sandbox.run("false").exit_code == 1
    assert sandbox.run("(exit 42)").exit_code == 42
    assert sandbox.run("echo err >&2; echo out").output == "err\nout\n"
    assert sandbox.run("printf 'no newline'").output == "no newline"
    assert sandbox.run("cat").output == ""  # stdin is /dev/null, never the protocol
    weird = "echo 'single' \"double\" $'tab\\there' \\\\back; echo ü"
    assert sandbox.run(weird).output == "single double tab\there \\back\nü\n"
    assert sandbox.run("cat <<'EOF'\nline1\n$NOT_EXPANDED\nEOF").output == "line1\n$NOT_EXPANDED\n"


def test_syntax_error_and_exit_keep_the_shell_usable(sandbox):
    assert sandbox.run("if then fi").exit_code == 2
    sandbox.run("cd /tmp")
    r = sandbox.run("echo bye; exit 7")
    assert r.exit_code == 7 and "bye" in r.output
    r = sandbox.run("echo back; pwd")
    assert r.output == "back\n/tmp\n"  # a new shell, in the last cwd


def test_non_utf8_and_binary_output(sandbox):
    r = sandbox.run("printf 'ok \\xff\\xfe \\xc3\\x28 end\\n'; head -c 2000 /dev/urandom >/dev/null; printf '\\x00z'")
    assert r.output.startswith("ok \ufffd\ufffd \ufffd( end\n") and r.output.endswith("\x00z")
    r = sandbox.run("head -c 100000 /dev/urandom")
    assert r.exit_code == 0 and len(r.output) > 1000


def test_large_output_is_capped_fast(sandbox):
    t0 = time.monotonic()
    r = sandbox.run("head -c 10000000 /dev/zero | tr '\\0' a; echo; echo THE-END")
    took = time.monotonic() - t0
    assert r.exit_code == 0 and took < 10
    assert len(r.output) < 30_200 and r.cut_bytes > 9_900_000
    assert "bytes of output cut" in r.output and r.output.endswith("THE-END\n") and r.output.startswith("aaaa")
    small = sandbox.run("seq 1 20000", cap_chars=1000)
    assert "of output cut" in small.output and small.output.startswith("1\n2\n")
    exact = sandbox.run("seq 1 500", cap_chars=1000)  # small enough to be cut exactly, in characters
    assert "characters of output cut" in exact.output and len(exact.output) < 1100
    assert small.output.endswith("20000\n") and len(small.output) < 1100
    assert sandbox.run("echo still").output == "still\n"


def test_overhead_per_command_is_small(sandbox):
    times = sorted(sandbox.run("true").duration_s for _ in range(50))
    assert times[25] < 0.005, f"median {times[25] * 1000:.2f} ms"


# -- timeouts and faults --------------------------------------------------------------------------
def test_timeout_kills_the_command_and_its_children(sandbox):
    from sao_harness.envs.errors import CommandTimeout

    sandbox.run("cd /tmp && export KEEP=1")
    t0 = time.monotonic()
    with pytest.raises(CommandTimeout) as ei:
        sandbox.run("echo started; bash -c 'sleep 1000 & sleep 1001 & wait' & sleep 1002", timeout_s=1)
    assert time.monotonic() - t0 < 6
    assert "started" in ei.value.output and "1 s" in str(ei.value)
    r = sandbox.run("ps -e -o comm= | grep -c sleep; pwd; echo $KEEP")
    # only the container's own `sleep infinity` is left; cwd and env survived (the shell may first
    # report the killed background job, as bash does)
    assert r.output.splitlines()[-3:] == ["1", "/tmp", "1"], r.output


def test_timeout_of_a_builtin_loop_replaces_the_shell(sandbox):
    from sao_harness.envs.errors import CommandTimeout

    sandbox.run("cd /usr")
    with pytest.raises(CommandTimeout):
        sandbox.run("while :; do :; done", timeout_s=1)
    assert sandbox.run("echo alive; pwd").output == "alive\n/usr\n"


def test_fork_bomb_is_bounded_and_the_sandbox_survives(make_sandbox):
    from sao_harness.envs.errors import CommandTimeout

    sb = make_sandbox(pids_limit=64)
    try:
        sb.run("bomb() { bomb | bomb & }; bomb; sleep 1", timeout_s=10)  # it fills the 64 pids in milliseconds
    except CommandTimeout:
        pass  # either outcome is fine: bounded, reported, no hang
    sb.kill_processes()
    r = sb.run("echo alive; cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max")
    assert r.output.splitlines()[-2:] == ["alive", "64"]
    assert sb.shell.session_size() == 1
    # the host is fine: a host process still forks
    assert subprocess.run(["true"]).returncode == 0


def test_memory_limit_is_reported_as_oom(make_sandbox):
    from sao_harness.envs.errors import OOMKilled

    sb = make_sandbox(memory="64m")
    with pytest.raises(OOMKilled) as ei:
        sb.run("python3 -c 'x = bytearray(256 * 1024 * 1024); print(len(x))'")
    assert "memory limit (64m)" in str(ei.value) and ei.value.exit_code == 137
    assert not ei.value.container_died
    assert sb.run("echo usable").output == "usable\n"
    assert sb.run("sh -c 'kill -9 $$'").exit_code == 137  # a later SIGKILL is not an OOM


def test_container_killed_from_outside_mid_command(sandbox):
    from sao_harness.envs.errors import ContainerDied

    threading.Timer(1.0, lambda: sandbox.container.kill()).start()
    t0 = time.monotonic()
    with pytest.raises(ContainerDied) as ei:
        sandbox.run("echo begin; sleep 60")
    assert time.monotonic() - t0 < 10
    assert "exited" in str(ei.value) and sandbox.name in str(ei.value)
    with pytest.raises(ContainerDied):
        sandbox.run("echo again")


def test_container_removed_from_outside(sandbox):
    from sao_harness.envs.errors import ContainerDied

    sandbox.container.remove(force=True)
    with pytest.raises(ContainerDied):
        sandbox.run("true")
    sandbox.close()  # idempotent and quiet


def test_missing_image_names_it(docker_engine):
    from sao_harness.envs.errors import ImageNotFound
    from sao_harness.envs.sandbox import Sandbox

    with pytest.raises(ImageNotFound) as ei:
        Sandbox("sao-harness/does-not-exist:nope", client=docker_engine)
    assert "sao-harness/does-not-exist:nope" in str(ei.value)


def test_engine_unreachable_is_a_clear_error(tmp_path):
    import docker

    from sao_harness.envs.errors import EngineGone
    from sao_harness.envs.sandbox import Sandbox

    sock = tmp_path / "no.sock"
    bogus = docker.DockerClient(base_url=f"unix://{sock}", version="1.41", timeout=5)
    with pytest.raises(EngineGone) as ei:
        Sandbox("anything:1", client=bogus)
    assert "unreachable" in str(ei.value)


# -- files and patches ----------------------------------------------------------------------------
def test_file_round_trip_through_the_archive_api(sandbox):
    blob = os.urandom(3 * 1024 * 1024 + 7)
    t0 = time.monotonic()
    sandbox.write_file("/tmp/deep/new/dir/blob.bin", blob, mode=0o600)
    assert sandbox.read_file("/tmp/deep/new/dir/blob.bin") == blob
    assert time.monotonic() - t0 < 10
    assert sandbox.run("stat -c '%a %s' /tmp/deep/new/dir/blob.bin").output == f"600 {len(blob)}\n"
    sandbox.write_file("rel.txt", "héllo\n")  # relative = under the workdir
    assert sandbox.run("cat /testbed/rel.txt").output == "héllo\n"
    assert sandbox.read_file("/testbed/rel.txt").decode() == "héllo\n"
    with pytest.raises(FileNotFoundError):
        sandbox.read_file("/nope/missing")
    with pytest.raises(IsADirectoryError):
        sandbox.read_file("/tmp")


def test_diff_against_a_base_commit(sandbox):
    setup = ("git init -q . && printf 'a\\nb\\n' > keep.txt && printf 'x\\n' > gone.txt && "
             "git add -A && git commit -qm base && git rev-parse HEAD")
    base = sandbox.run(setup, check=True).output.strip().splitlines()[-1]
    sandbox.run("printf 'a\\nB\\n' > keep.txt && rm gone.txt && mkdir -p sub && echo new > sub/new.txt && "
                "printf '\\x00\\x01' > bin.dat && git commit -qam 'agent commit'", check=True)
    sandbox.write_file("sub/later.txt", "written via archive\n")
    patch = sandbox.diff(base)
    assert "diff --git a/keep.txt b/keep.txt" in patch and "+B" in patch
    assert "deleted file mode" in patch and "sub/new.txt" in patch and "sub/later.txt" in patch
    assert "GIT binary patch" in patch
    assert ".sao-patch" not in patch
    # the patch applies to the base commit
    sandbox.write_file("/tmp/p.diff", patch)
    r = sandbox.run(f"git stash -uq; git checkout -q {base} && git apply --check /tmp/p.diff && echo applies")
    assert "applies" in r.output, r.output
    assert sandbox.run("git status --porcelain | grep -c sao-patch").output.strip() == "0"


def test_exec_argv_and_docker_env_for_attached_tools(sandbox):
    argv = sandbox.exec_argv(tty=False, command=["bash", "-c", "echo $0 from $(hostname)"])
    assert argv[:3] == ["docker", "exec", "-i"] and sandbox.container_id in argv
    out = subprocess.run(argv, env=sandbox.docker_env(), capture_output=True, text=True, timeout=30)
    assert out.stdout == "bash from sandbox\n", out.stderr


def test_a_lost_patch_read_is_read_again_and_never_a_short_patch(sandbox, monkeypatch):
    """The engine sometimes returns nothing for a short exec. The diff knows its byte count: a short read
    is read again; one that stays short (a lost reply does not repeat; a lying head or wc, planted by
    the agent, does) is PatchUnavailable, never a shorter patch."""
    from sao_harness.envs.limits import PatchUnavailable
    from sao_harness.envs.sandbox import READ_ATTEMPTS

    base = sandbox.run("mkdir -p /tmp/lost && cd /tmp/lost && git init -q . && echo a > f.txt && git add -A && "
                       "git commit -qm base && git rev-parse HEAD", check=True).output.strip().splitlines()[-1]
    sandbox.run("echo b > /tmp/lost/f.txt", check=True)
    want = sandbox.diff_bytes(base, "/tmp/lost")
    assert b"+b" in want
    real_read, reads = sandbox._read_bounded, []

    def lose_first(path, limit, timeout_s):
        reads.append(path)
        return b"" if len(reads) == 1 else real_read(path, limit, timeout_s)

    monkeypatch.setattr(sandbox, "_read_bounded", lose_first)
    assert sandbox.diff_bytes(base, "/tmp/lost") == want and len(reads) == 2
    reads.clear()
    monkeypatch.setattr(sandbox, "_read_bounded", lambda path, limit, timeout_s: reads.append(path) or want[:-1])
    with pytest.raises(PatchUnavailable, match=f"read {len(want) - 1} of the patch's {len(want)} bytes"):
        sandbox.diff_bytes(base, "/tmp/lost")
    assert len(reads) == READ_ATTEMPTS
    assert sandbox.run("ls -a /tmp/lost/.git | grep -c sao-patch").output.strip() == "0"  # cleaned up either way


def test_patch_extraction_broken_by_the_agent_is_its_doing_but_a_dead_container_is_not(make_sandbox):
    """The agent is root in its sandbox: a deleted .git or a replaced git is PatchUnavailable (reward 0);
    a container that is gone while the patch is read stays an infrastructure fault (ContainerDied)."""
    from sao_harness.envs.errors import ContainerDied
    from sao_harness.envs.limits import PatchUnavailable

    sb = make_sandbox()
    base = sb.run("cd /testbed && git init -q . && echo a > f.txt && git add -A && git commit -qm base && "
                  "git rev-parse HEAD", check=True).output.strip().splitlines()[-1]
    sb.run("echo b > /testbed/f.txt", check=True)
    assert b"+b" in sb.diff_bytes(base)
    sb.run("mv /usr/bin/git /usr/bin/git.real && printf '#!/bin/sh\\nexit 3\\n' > /usr/bin/git && "
           "chmod +x /usr/bin/git", check=True)
    with pytest.raises(PatchUnavailable, match="gave no patch"):
        sb.diff_bytes(base)
    sb.run("mv /usr/bin/git.real /usr/bin/git && rm -rf /testbed/.git", check=True)
    with pytest.raises(PatchUnavailable, match="not a git repository"):
        sb.diff_bytes(base)
    sb.container.kill()
    with pytest.raises(ContainerDied):
        sb.diff_bytes(base)


# -- start slots ----------------------------------------------------------------------------------
@pytest.mark.parametrize("slots", [1, 3])
def test_sandbox_starts_wait_for_a_node_slot(make_sandbox, monkeypatch, tmp_path, slots):
    """sandbox.start_slots = 1: three sandboxes started at once start one after another (the 2nd and 3rd wait
    for a whole start); = 3 (power: the same run with room for all) none waits."""
    monkeypatch.setenv("SAO_SLOT_DIR", str(tmp_path))
    made, errors = [], []

    def start():
        try:
            made.append(make_sandbox(start_slots=slots))
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    threads = [threading.Thread(target=start) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and len(made) == 3
    waits = sorted(sb.start_wait_s for sb in made)
    if slots == 1:
        assert waits[0] < 0.2 and waits[1] > 0.1 and waits[2] > waits[1], waits
    else:
        assert waits[-1] < 0.2, waits
    assert all(sb.run("echo ok").output == "ok\n" for sb in made)
