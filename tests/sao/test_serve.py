"""`sao serve` as a process: OpenAI client in, traces in the run's store out, clean shutdown."""
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from sao_harness.harness.store import TraceStore, read_shard
from sao_harness.harness.tiny_model import ensure_tiny_model
from tests.support.proxy import start_sao_serve

REPO = Path(__file__).resolve().parents[2]


def sao(*args):
    return subprocess.Popen([sys.executable, "-m", "sao_harness.sao.cli", "serve", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    cache = REPO / ".cache" / "sao"
    ensure_tiny_model(cache, 0)
    root = tmp_path_factory.mktemp("runs")
    proc, base = start_sao_serve(f"model.cache_dir={cache}", f"run.root={root}", "run.name=serve-test",
                                 "sampling.max_tokens=6")
    yield proc, base, root / "serve-test"
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)


@pytest.mark.slow  # a `sao serve` process with the tiny model
def test_serve_chat_close_and_shutdown(served):
    proc, base, run_dir = served
    c = OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=60,
               default_headers={"X-Episode-Id": "ep-1", "X-Task-Id": "django-1"})
    r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}])
    assert r.choices[0].finish_reason in ("length", "stop") and r.usage.completion_tokens <= 6
    closed = httpx.post(base + "/episodes/ep-1/close", timeout=30).json()
    [traj] = read_shard(closed["shard"])
    assert traj.traj_id == closed["traj_id"] and traj.task_id == "django-1" and traj.turns == 1
    assert Path(closed["shard"]).parent == run_dir / "traces"
    r = httpx.post(base + "/episodes/ep-1/close", timeout=30)
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_episode"
    # an episode still open at shutdown is written on SIGTERM
    c2 = OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=60,
                default_headers={"X-Episode-Id": "ep-open"})
    c2.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], temperature=0.5)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, out
    assert "wrote 1 open episode trace" in out
    assert sorted(t.task_id for t in TraceStore(run_dir)) == ["django-1", "ep-open"]


def test_serve_refuses_non_loopback_hosts():
    proc = sao("--host", "10.1.2.3")
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 2 and "not a loopback address" in out
