"""The SDK's terminal and file editor executing inside a Docker sandbox, and whole agent episodes there.

Needs a Docker engine and the base image (``make docker``). The LLM is the scripted fake server.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from sao_harness.envs.config import SandboxConfig
from sao_harness.envs.sandbox import Sandbox
from sao_harness.harness.agent import AgentSettings, ErrorKind, run_agent
from sao_harness.harness.prompts import instruction_for
from sao_harness.harness.trace import Status
from tests.support.agent import make_repo_sandbox
from tests.support.fakellm import FakeLLM, Reply, prompt_call, text, tool

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def sandbox(engine):
    sb = make_repo_sandbox(engine)
    yield sb
    sb.close()


@pytest.fixture(scope="module")
def tools(sandbox):
    from sao_harness.harness.tools import SandboxTarget, SandboxTools  # lazy: imports the openhands SDK

    t = SandboxTools(SandboxTarget.from_sandbox(sandbox))
    yield t
    t.close()


def term(tools, command, **kw):
    from openhands.tools.terminal.definition import TerminalAction  # lazy: imports the openhands SDK

    obs = tools.terminal(TerminalAction(command=command, **kw))
    return obs, "".join(c.text for c in obs.to_llm_content)


def test_terminal_runs_in_the_container(sandbox, tools):
    marker = f"in-container-{uuid.uuid4().hex}"
    sandbox.write_file(f"/{marker}", "yes\n")
    obs, out = term(tools, f"cat /{marker}")
    assert obs.exit_code == 0 and out.startswith("yes\n[The command completed with exit code 0.]")
    assert "[Current working directory: /testbed]" in out
    assert not os.path.exists(f"/{marker}")
    obs, out = term(tools, "cd sub && pwd")
    assert obs.text == "/testbed/sub" and obs.metadata.working_dir == "/testbed/sub"
    obs, _ = term(tools, "pwd")
    assert obs.text == "/testbed/sub"  # cwd persists
    obs, _ = term(tools, "false")
    assert obs.exit_code == 1
    term(tools, "cd /testbed")


def test_terminal_wide_clean_output_and_interrupt(tools):
    obs, _ = term(tools, "python3 -c \"print('x' * 3000)\"")
    assert obs.text == "x" * 3000  # one line: the PTY is wide, nothing wrapped
    obs, _ = term(tools, "printf 'a\\tb\\n'; echo done")
    assert obs.text == "a\tb\ndone" and "\x1b" not in obs.text  # no bracketed-paste codes
    obs, out = term(tools, "sleep 100", timeout=1)
    assert obs.exit_code == -1 and "timed out after 1.0 seconds" in out
    obs, out = term(tools, "C-c", is_input=True)
    assert obs.exit_code == 130 and "CTRL+C was sent" in out  # ^C went through the TTY
    obs, _ = term(tools, "echo still-alive")
    assert obs.text == "still-alive"


@pytest.mark.parametrize("command, kw", [
    ("sleep 100; echo late", {"timeout": 1e9}),  # the agent's own timeout: it waited for the command
    ("for i in $(seq 100); do echo x$i; sleep 0.5; done", {}),  # steady output: the SDK never stops waiting
    ("trap '' INT; for i in $(seq 100); do echo y$i; sleep 0.5; done", {}),  # and ^C ignored: the shell is killed
], ids=["huge-timeout", "steady-output", "ignores-ctrl-c"])
def test_no_terminal_call_outlives_max_command_s(sandbox, monkeypatch, command, kw):
    """A policy that hangs a terminal call hangs its rollout worker (and a synchronous group barrier)."""
    from openhands.tools.terminal.definition import TerminalAction  # lazy: imports the openhands SDK

    from sao_harness.harness.tools import SandboxTarget, SandboxTools, terminal

    grace = 1.0  # the ^C-to-SIGKILL wait (5 s for users): a shell that ignores ^C waits all of it here
    monkeypatch.setattr(terminal, "KILL_GRACE_S", grace)
    with SandboxTools(SandboxTarget.from_sandbox(sandbox), max_command_s=2) as t:
        t0 = time.monotonic()
        obs = t.terminal(TerminalAction(command=command, **kw))
        took = time.monotonic() - t0
        assert 2 <= took < 2 + grace + 5, took
        assert obs.text.endswith("[The sandbox stopped this command: one command may run for at most 2 seconds.]")
        assert "late" not in obs.text and t.failure is None
        obs = t.terminal(TerminalAction(command="echo alive"))  # the next command runs (in a new shell if killed)
        assert "alive" in obs.text and not obs.text.endswith("seconds.]")


def test_terminal_reset_ends_what_the_old_shell_left_running(tools):
    term(tools, "sleep 987 &")
    obs, _ = term(tools, "ps -eo args | grep -c '^sleep 987'")
    assert obs.text == "1"
    obs, out = term(tools, "ps -eo args | grep -c '^sleep 987'; ps -eo args | grep -c '^bash -i'", reset=True)
    assert out.startswith("Terminal session has been reset.") and obs.text.endswith("0\n1")
    term(tools, "cd /testbed")


def _sdk_editor_on_host(root: str):
    from openhands.tools.file_editor.impl import FileEditorExecutor  # lazy: imports the openhands SDK

    return FileEditorExecutor(workspace_root=root + "/testbed")


EDITOR_SCRIPT = [
    dict(command="view", path="/testbed/ed"),
    dict(command="view", path="/testbed/ed/x.py"),
    dict(command="view", path="/testbed/ed/x.py", view_range=[2, 3]),
    dict(command="view", path="/testbed/ed/x.py", view_range=[2, 10]),
    dict(command="view", path="/testbed/ed/x.py", view_range=[0, 1]),
    dict(command="view", path="/testbed/ed/nope.py"),
    dict(command="view", path="ed/x.py"),
    dict(command="view", path="/testbed/ed/../ed/x.py"),
    dict(command="view", path="/testbed/ed/link.py"),
    dict(command="view", path="/testbed/ed/blob.bin"),
    dict(command="view", path="/testbed/ed/latin.txt"),
    dict(command="create", path="/testbed/ed/new.py", file_text="print('new')\n"),
    dict(command="create", path="/testbed/ed/x.py", file_text="clobber\n"),
    dict(command="create", path="/testbed/ed/missing/deep.py", file_text="x\n"),
    dict(command="str_replace", path="/testbed/ed/x.py", old_str="beta", new_str="BETA"),
    dict(command="str_replace", path="/testbed/ed/x.py", old_str="not there", new_str="y"),
    dict(command="str_replace", path="/testbed/ed/x.py", old_str="dup", new_str="y"),
    dict(command="str_replace", path="/testbed/ed/sub", old_str="a", new_str="b"),
    dict(command="insert", path="/testbed/ed/x.py", insert_line=1, new_str="inserted"),
    dict(command="insert", path="/testbed/ed/x.py", insert_line=99, new_str="z"),
    dict(command="undo_edit", path="/testbed/ed/x.py"),
    dict(command="undo_edit", path="/testbed/ed/new.py"),
    dict(command="str_replace", path="/testbed/ed/latin.txt", old_str="caf", new_str="CAF"),
    dict(command="view", path="/testbed/ed"),
]
FILES = {"x.py": b"alpha\nbeta\ngamma\ndup\ndup\n", "sub/s.py": b"s\n", "sub/deeper/t.py": b"t\n",
         ".hidden": b"h\n", "blob.bin": bytes(range(256)) * 4, "latin.txt": "café crème\n".encode("latin-1")}


def test_file_editor_matches_the_sdk_editor_on_a_real_filesystem(sandbox, tools):
    """Every observation text, error flag and resulting file equals what the SDK's own editor gives on
    a host directory laid out like the container (host paths mapped back)."""
    from openhands.tools.file_editor.definition import FileEditorAction  # lazy: imports the openhands SDK

    root = tempfile.mkdtemp(prefix="sao-test-editor-")
    host = _sdk_editor_on_host(root)
    try:
        for rel, data in FILES.items():
            p = Path(root, "testbed/ed", rel)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
            sandbox.write_file(f"/testbed/ed/{rel}", data)
        os.symlink("x.py", Path(root, "testbed/ed/link.py"))
        sandbox.run("ln -s x.py /testbed/ed/link.py", 30, check=True)
        tmpname = re.compile(r"\.deep\.py\.[A-Za-z0-9_]+\.tmp")
        for step in EDITOR_SCRIPT:
            a = FileEditorAction(**step)
            mine = tools.file_editor(a)
            path = root + step["path"] if step["path"].startswith("/") else step["path"]
            ref = host(a.model_copy(update={"path": path}))
            want = tmpname.sub("TMP", ref.text.replace(root, ""))
            assert tmpname.sub("TMP", mine.text) == want, step
            assert mine.is_error == ref.is_error, step
            assert (mine.path is None) == (ref.path is None), step
            if step["command"] != "view" and not ref.is_error:  # the file is in the container only
                assert sandbox.read_file(step["path"]) == Path(path).read_bytes(), step
                assert not os.path.exists(step["path"]), step
        mode = sandbox.run("stat -c %a /testbed/ed/new.py", 30).output.strip()
        assert mode == oct(os.stat(Path(root, "testbed/ed/new.py")).st_mode & 0o777)[2:]
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(host.editor._history_manager.cache.directory, ignore_errors=True)
        sandbox.run("rm -rf /testbed/ed", 30)


def _script_no_host_execution(u: str, call):
    return [
        call("terminal", command=f"touch /tmp/HOSTCANARY-{u}-a"),
        call("terminal", command="exit"),
        call("terminal", command=f"touch /tmp/HOSTCANARY-{u}-b"),
        call("terminal", command=f"touch /tmp/HOSTCANARY-{u}-c", reset=True),
        call("terminal", command="", reset=True),
        call("terminal", command=f"touch /tmp/HOSTCANARY-{u}-d && echo $$ > /tmp/HOSTCANARY-{u}-pid"),
        call("file_editor", command="create", path=f"/tmp/HOSTCANARY2-{u}", file_text="canary\n"),
        call("file_editor", command="str_replace", path=f"/tmp/HOSTCANARY2-{u}", old_str="canary", new_str="bird"),
        call("finish", message="done"),
    ]


def test_no_command_or_file_operation_touches_the_host(engine):
    """touch / exit / touch / reset / touch and file_editor create: all in the container, none on the host."""
    u = uuid.uuid4().hex
    sb = make_repo_sandbox(engine)
    try:
        with FakeLLM(_script_no_host_execution(u, tool)) as f:
            r = run_agent(sb, base_url=f.base_url, instruction="Leave canaries.", episode_id=f"ep-{u}",
                          task_id="canary", settings=AgentSettings(stuck_detection=False))
        assert r.finished and r.error is None, r
        assert r.events["terminal_sessions"] == 4  # first shell, after `exit`, after two resets
        host = [p for p in Path("/tmp").glob(f"HOSTCANARY*{u}*")]
        assert host == [], f"agent actions reached the host: {host}"
        listing = sb.run(f"ls /tmp | grep {u}", 30).output.split()
        assert sorted(listing) == sorted([f"HOSTCANARY-{u}-{s}" for s in "abcd"] + [f"HOSTCANARY-{u}-pid",
                                                                                   f"HOSTCANARY2-{u}"])
        assert sb.read_text(f"/tmp/HOSTCANARY2-{u}") == "bird\n"
        # the terminal observations the model saw: the reset texts are the SDK's
        tool_msgs = [m for m in f.requests[-1]["messages"] if m["role"] == "tool"]
        texts = ["".join(c["text"] for c in m["content"]) for m in tool_msgs]
        assert "terminal was closed" in texts[1]
        assert texts[2].startswith("Terminal session has been reset.")
        assert texts[3].startswith("Terminal session has been reset.")
    finally:
        sb.close()
    assert not list(Path("/tmp").glob(f"HOSTCANARY*{u}*"))


HOSTILE_CALLS = [  # (tool, arguments): what a policy can send that no well-behaved agent would
    ("file_editor", dict(command="view", path="/testbed/a\x00.py")),
    ("file_editor", dict(command="view", path="/dev/zero")),
    ("file_editor", dict(command="view", path="/proc/self/mem")),
    ("file_editor", dict(command="view", path="/testbed/a.py", view_range=[-5, 10**12])),
    ("file_editor", dict(command="view", path="/testbed/a.py", view_range="1,2")),
    ("file_editor", dict(command="insert", path="/testbed/a.py", insert_line=-1, new_str="y")),
    ("file_editor", dict(command="insert", path="/testbed/a.py", insert_line=10**30, new_str="y")),
    ("file_editor", dict(command="create", path="/testbed", file_text="x")),
    ("file_editor", dict(command="str_replace", path="/testbed/a.py", old_str="", new_str="z")),
    ("file_editor", dict(command="view", path="/testbed/" + "a" * 5000)),  # ENAMETOOLONG on the host copy
    ("file_editor", dict(command="view", path="/" + "a/" * 3000)),
    ("file_editor", dict(command="delete", path="/testbed/a.py")),
    ("file_editor", dict(command="view", path=5)),
    ("file_editor", dict(command="undo_edit", path="/testbed/never.py")),
    ("terminal", dict(command="echo a\x00b")),
    ("terminal", dict(command="")),
    ("terminal", dict(command="echo hi", timeout=-1)),
    ("terminal", dict(command="echo hi", timeout="abc")),
    ("terminal", dict(command="C-z", is_input=True)),
    ("terminal", dict(command="echo hi", reset=True, is_input=True)),
    ("terminal", dict(command="kill -9 $$")),
    ("finish", dict(message=5)),
]


def test_hostile_tool_calls_are_errors_the_agent_sees_and_the_sandbox_lives_on(engine):
    """Each call above, then `echo alive`: every one is answered (an error or a result), the terminal still
    works after it, the episode ends as the agent's own (never agent_error / infra_error: no reward) and no
    host path appears in anything the model is sent."""
    script = []
    for name, args in HOSTILE_CALLS:
        script += [tool(name, **args), tool("terminal", command="echo alive")]
    script += [Reply(tool_calls=[("think", {"thought": "a"})] * 200), tool("finish", message="done")]
    sb = make_repo_sandbox(engine)
    try:
        with FakeLLM(script) as f:
            r = run_agent(sb, base_url=f.base_url, instruction="x", episode_id="ep-hostile", task_id="t-hostile",
                          settings=AgentSettings(max_iterations=len(script), stuck_detection=False))
        assert r.status == Status.OK and r.finished and r.error is None, r
        assert len(f.requests) == len(script)
        for i in range(len(HOSTILE_CALLS)):
            alive = "".join(c["text"] for c in f.requests[2 * i + 2]["messages"][-1]["content"])
            assert "alive\n[The command completed with exit code 0.]" in alive, HOSTILE_CALLS[i]
        body = json.dumps(f.requests)
        for host_path in ("sao-agent-ws-", "sao-fe-", tempfile.gettempdir() + "/tmp"):
            assert host_path not in body
    finally:
        sb.close()


def test_a_prompt_format_call_nested_past_pythons_recursion_is_shown_as_malformed(sandbox):
    """The SDK decodes a prompt-format array parameter with json.loads and catches only JSONDecodeError: 3,000
    brackets ended the run as an agent_error (no reward). It is a malformed call the agent is shown."""
    deep = text("<function=file_editor>\n<parameter=command>view</parameter>\n<parameter=path>/testbed/a.py"
                "</parameter>\n<parameter=view_range>" + "[" * 3000 + "]" * 3000 + "</parameter>\n</function>")
    with FakeLLM([deep, prompt_call("finish", message="done")]) as f:
        r = run_agent(sandbox, base_url=f.base_url, instruction="x", episode_id="ep-deep", task_id="t-deep",
                      settings=AgentSettings(native_tool_calling=False))
    assert r.status == Status.OK and r.finished and r.error is None, r
    assert "nested too deeply" in json.dumps(f.requests[1]["messages"][-1])


@pytest.mark.parametrize("native", [True, False], ids=["native", "prompt"])
def test_episode_edits_the_repo_in_both_tool_modes(engine, native):
    call = tool if native else prompt_call
    sb = make_repo_sandbox(engine)
    try:
        script = [call("terminal", command="grep -rn 'x = 1' ."),
                  call("file_editor", command="view", path="/testbed/a.py"),
                  call("file_editor", command="str_replace", path="/testbed/a.py", old_str="x = 1", new_str="x = 2"),
                  call("terminal", command="python3 -c 'import a; print(a.x)'"),
                  call("finish", message="x is 2 now")]
        with FakeLLM(script) as f:
            r = run_agent(sb, base_url=f.base_url, instruction=instruction_for("Make x equal 2.", "HEAD"),
                          episode_id="ep-edit", task_id="t-edit",
                          settings=AgentSettings(native_tool_calling=native, temperature=0.8))
        assert r.finished and r.iterations == 5 and r.status == Status.OK, r
        assert r.events["tool_calls"] == {"terminal": 2, "file_editor": 2, "finish": 1}
        assert "+x = 2" in sb.diff("HEAD")
        last = json.dumps(f.requests[-1])
        assert "2\\n[The command completed with exit code 0.]" in last
        body = json.dumps(f.requests)
        for host_path in ("sao-agent-ws-", "sao-fe-", tempfile.gettempdir() + "/tmp"):
            assert host_path not in body  # no host scratch path ever reaches the model
        if native:
            names = [t["function"]["name"] for t in f.requests[0]["tools"]]
            assert names == ["terminal", "file_editor", "finish", "think"]
            fe = next(t for t in f.requests[0]["tools"] if t["function"]["name"] == "file_editor")
            assert "Your current working directory is: /testbed\n" in fe["function"]["description"]
        else:
            assert "<function=terminal>" in f.requests[-1]["messages"][-2]["content"]
    finally:
        sb.close()


def test_container_gone_mid_episode_is_an_infra_error(engine):
    sb = make_repo_sandbox(engine)
    try:
        def remove_container(_body):
            sb.container.remove(force=True)
            return tool("terminal", command="echo hello")

        with FakeLLM([tool("terminal", command="echo hi"), remove_container, tool("terminal", command="echo again"),
                      tool("finish", message="x")]) as f:
            r = run_agent(sb, base_url=f.base_url, instruction="x", episode_id="ep-gone", task_id="t-gone")
        assert r.error_kind == ErrorKind.INFRA and r.status == Status.INFRA_ERROR, r
        assert "SandboxUnavailable" in r.error and "removed" in r.error
        assert len(f.requests) == 2  # no LLM turn after the sandbox died
    finally:
        sb.close()


@pytest.mark.parametrize("attack", [
    ["mv /usr/bin/bash /usr/bin/bash.moved", "file_editor"],  # the probe's bash is gone, the shell lives
    ["mv /usr/bin/bash /usr/bin/bash.moved", "exit", "echo after"],  # no new shell starts
    ["chmod -x /usr/bin/bash; exit", "echo after"],
    ["mv /usr/bin/bash /tmp/b && cp /usr/bin/true /usr/bin/bash",  # exit 0, no output: like a lost reply
     "file_editor", "exit", "echo after"],
], ids=["mv-bash-edit", "mv-bash-exit", "chmod-bash-exit", "true-as-bash"])
def test_an_agent_that_breaks_its_tools_gets_an_error_not_an_infra_failure(engine, attack):
    """The policy is rewarded for hiding a failure as an infra error (no reward): whatever it does inside a
    running container shows as the tool's error, the episode goes on and ends as its own."""
    calls = [tool("file_editor", command="view", path="/testbed/a.py") if c == "file_editor"
             else tool("terminal", command=c) for c in attack]
    sb = make_repo_sandbox(engine)
    try:
        with FakeLLM([*calls, tool("finish", message="done")]) as f:
            r = run_agent(sb, base_url=f.base_url, instruction="x", episode_id="ep-break", task_id="t-break")
        assert r.status == Status.OK and r.finished and r.error is None, r
        assert len(f.requests) == len(attack) + 1  # every call answered, then finish
        seen = json.dumps(f.requests[-1]["messages"][-1])
        assert "Error executing tool" in seen and ("no shell starts" in seen or "cannot read the sandbox" in seen)
        assert sb.container_id not in json.dumps(f.requests)
    finally:
        sb.close()


def test_a_first_shell_that_does_not_start_is_infrastructure(engine):
    """Before the agent's first action nothing in the container is its doing: no shell is SandboxUnavailable."""
    from sao_harness.harness.tools import SandboxTarget, SandboxTools, SandboxUnavailable

    sb = make_repo_sandbox(engine)
    try:
        sb.run("mv /usr/bin/bash /tmp/b", 30, check=True)  # the sandbox's own shell keeps running
        with pytest.raises(SandboxUnavailable, match="no shell starts"):
            SandboxTools(SandboxTarget.from_sandbox(sb))
    finally:
        sb.close()


def test_file_editor_writes_where_the_archive_api_cannot(engine):
    """Read-only root with a tmpfs /tmp: the editor still writes /tmp and the workdir; a write to the
    read-only root is the agent's error, as the SDK editor would report it."""
    # lazy: imports the openhands SDK
    from openhands.tools.file_editor.definition import FileEditorAction

    from sao_harness.harness.tools import SandboxTarget, SandboxTools

    client, image = engine
    with Sandbox(image, SandboxConfig(read_only=True), client=client) as sb:
        with SandboxTools(SandboxTarget.from_sandbox(sb)) as t:
            for path in ("/tmp/repro.py", "/testbed/y.py"):
                obs = t.file_editor(FileEditorAction(command="create", path=path, file_text="v = 1\n"))
                assert obs.text == f"File created successfully at: {path}" and not obs.is_error
                obs = t.file_editor(FileEditorAction(command="str_replace", path=path, old_str="v = 1",
                                                     new_str="v = 2"))
                assert not obs.is_error and obs.text.startswith(f"The file {path} has been edited.")
                assert sb.run(f"cat {path}", 30).output == "v = 2\n"
            obs = t.file_editor(FileEditorAction(command="create", path="/etc/z.conf", file_text="z\n"))
            assert obs.is_error and "Read-only file system" in obs.text
            assert obs.text.endswith("while trying to write to /etc/z.conf")
            assert t.failure is None


def test_file_editor_probe_survives_a_lost_exec_reply_but_not_a_persistent_one(sandbox, tools, monkeypatch):
    """The engine sometimes returns nothing for a short exec (exit 0). The read-only probe asks again, so
    one lost reply costs nothing. A reply that never parses from a running container is what the agent did
    to it (an agent can replace `bash` with `true`): the call's error, never an infrastructure failure."""
    from openhands.tools.file_editor.definition import FileEditorAction  # lazy: imports the openhands SDK

    from sao_harness.harness.tools.file_editor import PROBE_ATTEMPTS
    from sao_harness.harness.tools.target import SandboxBroken

    sandbox.write_file("/testbed/lost.py", b"a = 1\n")
    editor = tools.file_editor
    real_exec, calls = editor._exec, []

    def lose_first_reply(argv):
        calls.append(argv[3])
        exec_id, out, err = real_exec(argv)
        return (exec_id, b"", b"") if len(calls) == 1 else (exec_id, out, err)

    monkeypatch.setattr(editor, "_exec", lose_first_reply)
    obs = tools.file_editor(FileEditorAction(command="view", path="/testbed/lost.py"))
    assert not obs.is_error and "a = 1" in obs.text and editor.failure is None
    assert calls[:2] == ["probe", "probe"]  # the probe was asked twice

    calls.clear()
    monkeypatch.setattr(editor, "_exec", lambda argv: calls.append(argv[3]) or (real_exec(argv)[0], b"", b""))
    with pytest.raises(SandboxBroken, match=f"failed {PROBE_ATTEMPTS} times"):
        tools.file_editor(FileEditorAction(command="view", path="/testbed/lost.py"))
    assert calls == ["probe"] * PROBE_ATTEMPTS and editor.failure is None
