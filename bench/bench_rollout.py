"""Harness overhead per turn, and episodes per hour with 8 in parallel (scripted policy, real everything else).

1. One scripted 50-turn episode through the real proxy, OpenHands SDK and Docker sandbox: per-turn time
   outside the engine = (agent wall time - engine time) / turns.
2. Eight bundled tasks at once (gold-patch scripted policy, graded by swebench): episodes per hour.
The scripted engine takes ~0 s, so both figures are the harness's own cost on this machine.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from _common import ROOT, verdict

from sao_harness.harness.engines.scripted_policy import ScriptedPolicyEngine, tool_call
from sao_harness.harness.proxy import ProxyServer
from sao_harness.harness.rollout import run_rollout
from sao_harness.harness.runner import load_tasks as run_tasks
from sao_harness.harness.store import TraceStore
from sao_harness.harness.tiny_model import ensure_tiny_model
from sao_harness.harness.trace import Status
from sao_harness.sao.config import load_config
from sao_harness.tasks.formats.loaders import load_tasks

TURNS = 50


def rollout(cfg, engine, tokenizer):
    tasks = run_tasks(cfg, "swe", log=lambda *_: None)  # as `sao rollout`: loaded and pre-flighted once
    proxy = ProxyServer(engine, tokenizer, cfg)
    proxy.start(port=0)
    try:
        t0 = time.monotonic()
        run_rollout(cfg, tasks, engine=engine, proxy=proxy, log=lambda *_: None)
        return time.monotonic() - t0
    finally:
        proxy.stop()


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    from transformers import AutoTokenizer

    from sao_harness.envs.engine import ensure_engine

    ensure_engine()
    from sao_harness.harness.agent import load_sdk

    load_sdk()  # the SDK import (~6 s) is once per process: keep it out of the per-turn figure
    tokenizer = AutoTokenizer.from_pretrained(ensure_tiny_model(ROOT / ".cache/sao"))
    tasks = load_tasks("bundled")
    with tempfile.TemporaryDirectory() as tmp:
        base = [f"run.root={tmp}", "sampling.max_tokens=4096", "agent.stuck_detection=false",
                f"model.cache_dir={ROOT / '.cache/sao'}", f"agent.max_iterations={TURNS + 5}",
                "proxy.context_budget=131072"]
        # 1. one long episode: 49 terminal / file-editor turns, then finish
        task = tasks[0]
        replies = []
        for i in range(TURNS - 1):
            if i % 2:
                replies.append(tool_call("terminal", {"command": f"cd /testbed && ls | head -3 && echo turn {i}"}))
            else:
                replies.append(tool_call("file_editor", {"command": "view", "path": "/testbed/README.md"}))
        replies.append(tool_call("finish", {"message": "done"}))
        cfg = load_config(ROOT / "configs/local.yaml", [*base, "run.name=long", f"tasks.instances=[{task.instance_id}]",
                                                        "rollout.workers=1"])
        engine = ScriptedPolicyEngine(tokenizer, {task.instance_id: replies},
                                      {task.instance_id: task.problem_statement})
        rollout(cfg, engine, tokenizer)
        [traj] = list(TraceStore(cfg.run.dir))
        print(f"long episode: status {traj.status}, {traj.turns} turns, {traj.num_tokens} tokens")
        agent_s = traj.timings["agent_s"]
        engine_s = traj.timings.get("engine_s", 0.0)
        per_turn = (agent_s - engine_s) / traj.turns
        print(f"scripted {traj.turns}-turn episode: agent {agent_s:.1f} s, engine {engine_s:.2f} s, "
              f"proxy {traj.timings.get('proxy_s', 0.0):.2f} s")
        print(f"harness overhead per turn (sandbox exec + SDK + proxy, outside the engine): {per_turn * 1000:.0f} ms")

        # 2. eight episodes in parallel, gold patches, graded
        eight = tasks[:8]
        cfg = load_config(ROOT / "configs/local.yaml", [
            *base, "run.name=eight", f"tasks.instances=[{', '.join(t.instance_id for t in eight)}]",
            "rollout.workers=8"])
        engine = ScriptedPolicyEngine.gold(tokenizer, eight)
        wall = rollout(cfg, engine, tokenizer)
        trajs = list(TraceStore(cfg.run.dir))
        resolved = sum(t.reward == 1.0 for t in trajs)
        episode_s = statistics.median(t.timings["episode_s"] for t in trajs)
        print(f"8 episodes in parallel: {wall:.1f} s wall, median episode {episode_s:.1f} s, "
              f"{resolved}/8 resolved -> {8 / wall * 3600:.0f} episodes per hour on this machine "
              f"(scripted policy: harness + grading cost only)")
        ok = resolved == 8 and all(t.status == Status.OK for t in trajs)
        print(f"all 8 resolved with status ok: {verdict(ok)}")


if __name__ == "__main__":
    main()
