"""Test helpers around the proxy: an engine spy, and a `sao serve` process that answers /health."""
from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]


class Spy:
    """Wraps an engine; records (prompt ids, result) of every generate call."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def generate(self, prompt_ids, sampling, timeout=None):
        res = self.inner.generate(prompt_ids, sampling, timeout)
        self.calls.append((list(prompt_ids), res))
        return res

    def __getattr__(self, name):
        return getattr(self.inner, name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_sao_serve(*args: str, timeout: float = 180) -> tuple[subprocess.Popen, str]:
    """`sao serve --port P ARGS...` as a process, once its /health answers 200: (process, base URL)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sao_harness.sao.cli",
                             "serve", "--port", str(port), *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"sao serve did not come up: {proc.communicate()[0]}")
        time.sleep(0.2)
