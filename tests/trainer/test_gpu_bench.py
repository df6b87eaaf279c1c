"""bench/gpu_update.py: the GPU check's code path runs on CPU (--dry-run), and without CUDA the GPU run skips."""
import importlib.util
import re
import subprocess
import sys

import pytest
import torch


def bench(project_root, *args):
    return subprocess.run([sys.executable, str(project_root / "bench/gpu_update.py"), *args], cwd=project_root,
                          capture_output=True, text=True, timeout=300)


def test_the_dry_run_updates_both_families_at_every_size(project_root):
    out = bench(project_root, "--dry-run")
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if " tokens: " in line and "routed experts" not in line]
    routes = [line for line in out.stdout.splitlines() if " tokens: routed experts" in line]
    assert [line.split(":")[0].split() for line in routes] == [["qwen3_moe", "tiny", "x2", n, "tokens"]
                                                               for n in ("128", "256")]
    for line in routes:  # the MoE slice: the routes' size and the replayed update against the unreplayed one
        assert re.search(r"routed experts \d+ B/token .* update with replay +[\d.]+ s = [\d.]+x the unreplayed",
                         line), line
    assert [line.split(":")[0].split() for line in lines] == [
        ["qwen3", "tiny", "x2", "128", "tokens"], ["qwen3", "tiny", "x2", "256", "tokens"],
        ["qwen3_moe", "tiny", "x2", "128", "tokens"], ["qwen3_moe", "tiny", "x2", "256", "tokens"]]
    for line in lines:
        assert re.search(r"[\d,]+ tokens/s \(update .* s: critic .* s, policy .* s\)", line), line
        assert re.search(r"peak RSS [\d.]+ [MG]iB \(plan [\d.]+ [MG]iB\); full (36|48) layers on 8 GPUs", line), line


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine runs the real check, not the skip")
def test_without_cuda_the_gpu_run_skips_and_says_why(project_root, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(project_root / "bench"))  # as `python bench/gpu_update.py` has it (_common)
    spec = importlib.util.spec_from_file_location("gpu_update", project_root / "bench/gpu_update.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main([]) == 0  # exit 0: `make bench` runs every bench
    assert "skipped: no CUDA device" in capsys.readouterr().out
