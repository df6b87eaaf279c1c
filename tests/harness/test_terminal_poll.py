"""The sandbox terminal's PTY past select()'s limit: a process running ~100 episodes holds descriptors >= 1024.

No Docker: the terminal's PTY master is a real PTY duplicated to a high descriptor, read by the terminal's
own reader thread (the SDK's used select, which raises ValueError there and left the shell mute).
"""
from __future__ import annotations

import os
import pty
import resource
import threading
import time

import pytest

from sao_harness.harness.tools import SandboxTarget
from sao_harness.harness.tools.terminal import DockerExecTerminal

HIGH_FD = 1500


@pytest.fixture
def high_pty():
    """``(master at HIGH_FD, slave)`` of a fresh PTY (the soft fd limit raised for it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= HIGH_FD:
        pytest.skip(f"the hard limit of open files ({hard}) is below {HIGH_FD}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, HIGH_FD + 1), hard))
    master, slave = pty.openpty()
    high = os.dup2(master, HIGH_FD)
    os.close(master)
    yield high, slave
    for fd in (high, slave):
        try:
            os.close(fd)
        except OSError:
            pass
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _output(term: DockerExecTerminal) -> str:
    with term.output_lock:
        return "".join(term.output_buffer)


def test_reader_thread_reads_a_pty_past_select_limit(high_pty):
    master, slave = high_pty
    term = DockerExecTerminal(SandboxTarget(container="none"))
    term._pty_master_fd = master
    reader = threading.Thread(target=term._read_output_continuously_pty, daemon=True)
    reader.start()
    os.write(slave, b"hello from the sandbox\n")
    deadline = time.monotonic() + 5
    while "hello from the sandbox" not in _output(term) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "hello from the sandbox" in _output(term)
    assert term._wait_for_pty_writable(1.0)  # the multi-line flow control, on the same descriptor
    term._pty_master_fd = None  # closed (as close() does): the reader ends
    reader.join(timeout=2)
    assert not reader.is_alive()
