"""`sao images pull` (trainer.run.images): without runtime.ray_address it prepares this node only, without Ray.

The cluster path (one Ray task per sandbox node) is tests/envs/test_images_pull.py (slow, two engines)."""
from __future__ import annotations

from types import SimpleNamespace

from sao_harness.sao.config import load_config
from sao_harness.trainer.run import images


def test_pull_without_a_ray_address_prepares_this_node_only(monkeypatch, capsys):
    calls = []

    def prepare_node(cfg, source, tasks, *, progress=True, log=print):
        calls.append((source, [t.instance_id for t in tasks]))
        return {"node": "here", "engine": "unix:///x", "images": 1, "present": [], "pulled": {},
                "failed": {"img:1": "no source has it"}, "evicted": [], "scrubbed": 0}

    monkeypatch.setattr(images, "prepare_node", prepare_node)
    monkeypatch.setattr(images, "start_ray", lambda *a, **k: (_ for _ in ()).throw(AssertionError("Ray started")))
    cfg = load_config(None, ["tasks.instances=[sao-harness__minicfg-8]"])
    assert images.cmd_pull(SimpleNamespace(cfg=cfg)) == 1  # a node misses an image
    assert calls == [("bundled", ["sao-harness__minicfg-8"])]
    out = capsys.readouterr().out
    assert out.startswith("node here (engine unix:///x): 1 image(s): 0 present") and "img:1: no source has it" in out
