"""envs pieces that need no Docker engine: quoting, framing, capping, mirrors, labels, config, CLI."""
from __future__ import annotations

import os
import socket
import struct
import subprocess
import threading
import time

import pytest


# -- the shell protocol ---------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["plain", "it's \"quoted\" $HOME `x` \\ back", "multi\nline\n\ttab", "ü ✓ 中",
                                  "\x01\x7f end", ""])
def test_ansi_c_quote_round_trips_through_bash(text):
    from sao_harness.envs.shell import ansi_c_quote

    out = subprocess.run(["bash", "-c", f"printf %s {ansi_c_quote(text)}"], capture_output=True)
    assert out.stdout.decode() == text


def test_collector_finds_a_sentinel_split_across_chunks():
    from sao_harness.envs.shell import _Collector

    col = _Collector(b"__SAO_tok", keep=1000)
    data = b"hello\nworld" + b"\n__SAO_tok 3 /tmp/x\n"
    done = [col.feed(data[i:i + 3]) for i in range(0, len(data), 3)]
    assert done[-1] and not any(done[:-1])
    assert col.line == b"3 /tmp/x"
    assert col.output(100) == ("hello\nworld", 0)


def test_collector_caps_huge_output_with_bounded_memory():
    from sao_harness.envs.shell import _Collector

    col = _Collector(b"__SAO_t", keep=2 * 1000)
    chunk = b"x" * 65536
    for _ in range(160):  # ~10 MB
        assert not col.feed(chunk)
    assert len(col.tail) < 20_000 and len(col.head) <= 2000
    assert col.feed(b"TAIL\n__SAO_t 0 /\n")
    text, cut = col.output(1000)
    assert text.startswith("x" * 500) and text.endswith("xTAIL") and "bytes of output cut" in text
    assert cut == 160 * 65536 + 4 - 1000 and len(text) < 1100


def test_collector_exact_cut_counts_characters():
    from sao_harness.envs.shell import _Collector

    col = _Collector(b"__SAO_t", keep=10_000)
    col.feed(("é" * 3000).encode() + b"\n__SAO_t 0 /\n")
    text, _ = col.output(1000)
    assert text.startswith("é" * 500) and text.endswith("é" * 500)
    assert "[... 2,000 characters of output cut ...]" in text


def test_stream_demultiplexes_docker_frames():
    from sao_harness.envs.shell import _Stream

    a, b = socket.socketpair()
    frames = struct.pack(">BxxxL", 1, 5) + b"hello" + struct.pack(">BxxxL", 2, 3) + b"err"
    for i in range(0, len(frames), 4):  # trickled in small pieces
        a.sendall(frames[i:i + 4])
    a.close()
    s = _Stream(b)
    got = b""
    while (chunk := s.read(time.monotonic() + 5)) is not None:
        got += chunk
    assert got == b"helloerr"


def test_stream_read_times_out():
    from sao_harness.envs.shell import _Stream

    a, b = socket.socketpair()
    with pytest.raises(TimeoutError):
        _Stream(b).read(time.monotonic() + 0.05)
    a.close()


HIGH_FD = 1500  # past select()'s FD_SETSIZE (1024): what a process running ~100 episodes at once hands out


@pytest.fixture
def high_fd_pair():
    """A connected socket pair whose reading end has descriptor ``HIGH_FD`` (the soft fd limit raised for it)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= HIGH_FD:
        pytest.skip(f"the hard limit of open files ({hard}) is below {HIGH_FD}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, HIGH_FD + 1), hard))
    a, b = socket.socketpair()
    high = socket.socket(fileno=os.dup2(b.fileno(), HIGH_FD))
    b.close()
    yield a, high
    a.close()
    high.close()
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_stream_reads_a_descriptor_past_select_limit(high_fd_pair):
    """The sandbox shell's stream waits with poll: select() raises ValueError on a descriptor >= 1024."""
    from sao_harness.envs.shell import _Stream, wait_fd

    a, high = high_fd_pair
    assert not wait_fd(high, 0.01) and wait_fd(high, 0.01, write=True)
    a.sendall(struct.pack(">BxxxL", 1, 2) + b"ok")
    assert _Stream(high).read(time.monotonic() + 5) == b"ok"
    with pytest.raises(TimeoutError):
        _Stream(high).read(time.monotonic() + 0.05)


# -- mirrors, labels, config ----------------------------------------------------------------------
def test_mirror_from_deb822_and_one_line_sources(tmp_path):

    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list").write_text("deb [signed-by=/nope.gpg] http://old.example/debian bullseye main\n")
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\n"
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n")
    (tmp_path / "sources.list.d" / "x.list.disabled").write_text("deb http://bad.example/debian bookworm main\n")
    from sao_harness.envs.mirror import host_sources

    srcs = host_sources(tmp_path)
    found = {s.uri for s in srcs}
    assert found == {"http://old.example/debian", "http://mirror.example/debian", "http://mirror.example/debian-security"}
    assert srcs[0].signed_by == "/nope.gpg" and srcs[1].suites == ("bookworm", "bookworm-updates")


def test_debian_mirror_prefers_override():
    from sao_harness.envs.mirror import debian_mirror

    assert debian_mirror("bookworm", "http://my.mirror/debian")[0] == "http://my.mirror/debian"
    uri, _ = debian_mirror("bookworm")
    assert uri.startswith("http")


def test_owner_alive_from_pid_labels():
    from sao_harness.envs.labels import HOST_KEY, PID_KEY, PID_START_KEY, owner_alive, run_labels

    mine = run_labels("r1")
    assert mine[PID_KEY] == str(os.getpid()) and owner_alive(mine) is True
    assert owner_alive({**mine, PID_START_KEY: "1"}) is False  # pid reused by another process
    p = subprocess.Popen(["true"])
    p.wait()
    assert owner_alive({**mine, PID_KEY: str(p.pid)}) is False
    assert owner_alive({**mine, HOST_KEY: "elsewhere"}) is None
    assert owner_alive({k: v for k, v in mine.items() if k != PID_KEY}) is None


def test_sandbox_config_validation():
    from pydantic import ValidationError

    from sao_harness.envs.config import SandboxConfig

    assert SandboxConfig(cap_add=["cap_chown", "setuid"]).cap_add == ["CHOWN", "SETUID"]
    with pytest.raises(ValidationError):
        SandboxConfig(memory="lots")
    with pytest.raises(ValidationError):
        SandboxConfig(cap_add=["rm -rf"])
    with pytest.raises(ValidationError):
        SandboxConfig(pids_limit=0)


def test_base_tag_is_a_stable_recipe_hash():
    from sao_harness.envs.config import DockerConfig
    from sao_harness.envs.images import base_recipe, base_tag, recipe_hash

    cfg = DockerConfig()
    assert base_tag(cfg) == base_tag(DockerConfig()) and base_tag(cfg).startswith("sao-harness/base:")
    assert len(base_tag(cfg).split(":")[1]) == 12
    assert base_tag(DockerConfig(mirror="http://other/debian")) == base_tag(cfg)  # the mirror is not content
    assert recipe_hash(base_recipe(DockerConfig(suite="trixie"))) != recipe_hash(base_recipe(cfg))
    assert base_tag(DockerConfig(base_image="me/img:1")) == "me/img:1"


def test_project_engine_config_has_no_bridge_and_its_own_paths(tmp_path):
    from sao_harness.envs.engine import ProjectEngine

    conf = ProjectEngine(tmp_path).daemon_config()
    assert conf["bridge"] == "none" and conf["iptables"] is False
    assert conf["ip-forward"] is False and conf["ip-masq"] is False
    assert conf["hosts"] == [f"unix://{tmp_path}/docker.sock"]
    for key in ("data-root", "exec-root", "pidfile"):
        assert conf[key].startswith(str(tmp_path))


def test_unreachable_engine_errors_name_the_socket(tmp_path):
    from sao_harness.envs.config import DockerConfig
    from sao_harness.envs.engine import docker_client, ensure_engine
    from sao_harness.envs.errors import EngineError, EngineGone

    url = f"unix://{tmp_path}/none.sock"
    with pytest.raises(EngineGone) as ei:
        docker_client(DockerConfig(host=url))
    assert url in str(ei.value)
    with pytest.raises(EngineError) as ei:
        ensure_engine(DockerConfig(host=url))
    assert url in str(ei.value) and "does not answer" in str(ei.value)


# -- CLI ------------------------------------------------------------------------------------------
def test_sandbox_exec_parser_keeps_the_command_after_double_dash():
    from sao_harness.sao.cli import build_parser, load_args_config

    args = build_parser().parse_args(["sandbox", "exec", "--image", "img:1", "--timeout", "3",
                                      "--set", "sandbox.memory=1g", "--", "echo", "-n", "a b"])
    assert args.image == "img:1" and args.timeout == 3.0
    from sao_harness.envs.cli import _command

    assert _command(args.cmd) == "echo -n 'a b'"
    assert _command(["--", "echo $HOME | wc -c"]) == "echo $HOME | wc -c"  # one argument: a shell string
    assert load_args_config(args).sandbox.memory == "1g"


def test_cli_registration_is_import_light():
    code = ("import argparse, sys; from sao_harness.envs import cli; from sao_harness.sao import cli as sao_cli; "
            "p = argparse.ArgumentParser(); cli.register(p.add_subparsers(), sao_cli.add_config_args); "
            "print('docker' in sys.modules)")
    out = subprocess.run([os.sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.stdout.strip() == "False", out.stderr


def test_run_scope_cleans_up_on_exception_without_an_engine(monkeypatch):
    from sao_harness.envs import gc

    calls = []
    monkeypatch.setattr(gc, "cleanup_run", lambda rid, client=None: calls.append(rid) or (0, 0))
    with pytest.raises(RuntimeError):
        with gc.run_scope("unit-run"):
            raise RuntimeError("boom")
    assert calls == ["unit-run"]
    done = []

    def in_thread():  # no signal handlers can be set off the main thread: still works
        with gc.run_scope("thread-run"):
            done.append(1)

    t = threading.Thread(target=in_thread)
    t.start()
    t.join()
    assert done == [1] and calls == ["unit-run", "thread-run"]


def test_no_engine_and_not_root_says_how_to_get_one(monkeypatch):
    from sao_harness.envs import engine
    from sao_harness.envs.config import DockerConfig
    from sao_harness.envs.errors import EngineError

    monkeypatch.setattr(engine, "find_engine", lambda cfg: (None, ["unix:///var/run/docker.sock: no socket"]))
    monkeypatch.setattr(engine.os, "geteuid", lambda: 1000)
    with pytest.raises(EngineError) as ei:
        engine.ensure_engine(DockerConfig())
    msg = str(ei.value)
    assert "no Docker engine answers" in msg and "sao docker up" in msg and "systemctl" in msg


def test_a_dockerd_that_dies_at_start_is_reported_with_its_log(tmp_path):
    from sao_harness.envs import engine
    from sao_harness.envs.config import DockerConfig
    from sao_harness.envs.errors import EngineError

    eng = engine.ProjectEngine(tmp_path)
    eng.log_file.write_text("level=info msg=starting\nlevel=fatal msg=\"failed to start daemon: boom\"\n")
    proc = subprocess.Popen(["false"])
    proc.wait()
    with pytest.raises(EngineError) as ei:
        engine._wait_ready(DockerConfig(state_dir=tmp_path, start_timeout_s=5), eng, proc)
    assert "failed to start daemon: boom" in str(ei.value) and "exited with code 1" in str(ei.value)
