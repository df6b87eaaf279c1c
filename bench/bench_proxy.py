"""Proxy overhead per turn over one long synthetic episode (scripted engine, growing history).

    .venv/bin/python bench/bench_proxy.py [--turns 300] [--obs-chars 600]

Drives one episode of ``--turns`` turns through the HTTP proxy like the OpenHands SDK does: the whole
history (system prompt, tools, every assistant reply re-serialized, every tool result) is resent each
turn. Reports, at turn 10 and at the last turn (median of the 10 turns ending there):
- ``proxy``: the proxy's own work per turn (history check, rendering and tokenizing the new messages,
  bookkeeping), measured inside the session as CPU time of its thread (wall time on a shared machine
  is mostly scheduler noise; it is printed too), engine time excluded: this must not grow with
  history (target: last-turn cost under 2x the turn-10 cost; prints PASS/FAIL);
- ``http``: client wall time minus engine time, which adds the client's JSON encoding of the whole
  history, the transfer and the server's JSON parse: O(history) by the OpenAI protocol itself.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import httpx
from _common import ROOT, verdict

from sao_harness.harness.engines.scripted import ScriptedEngine
from sao_harness.harness.proxy import ProxyServer
from sao_harness.harness.tiny_model import ensure_tiny_model
from sao_harness.sao.config import load_config

TOOLS = [{"type": "function", "function": {"name": name, "description": desc * 20, "parameters": {
    "type": "object", "properties": {"command": {"type": "string", "description": "the command"},
                                     "path": {"type": "string"}}, "required": ["command"]}}}
         for name, desc in (("terminal", "Run a bash command in the sandbox. "),
                            ("file_editor", "View, create and edit files. "), ("finish", "End the task. "))]


def reply(i: int) -> str:
    return (f"Step {i}: let me check the next file.\n<tool_call>\n"
            + json.dumps({"name": "terminal", "arguments": {"command": f"sed -n {i},{i + 40}p src/module_{i % 17}.py"}})
            + "\n</tool_call>")


def observation(i: int, chars: int) -> str:
    line = f"{i:5d}    def method_{i}(self, value):  # returns the parsed value\n"
    return (line * (chars // len(line) + 1))[:chars]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=300)
    ap.add_argument("--obs-chars", type=int, default=600)
    args = ap.parse_args()

    cfg = load_config(None, [f"model.cache_dir={ROOT / '.cache' / 'sao'}", "proxy.context_budget=10000000"])
    path = ensure_tiny_model(cfg.model.cache_dir, 0)
    engine = ScriptedEngine(str(path), [reply(i) for i in range(args.turns)])
    proxy = ProxyServer(engine, engine.tokenizer, cfg)
    url = proxy.start()
    msgs = [{"role": "system", "content": "You are OpenHands agent, a helpful AI assistant. " * 150},
            {"role": "user", "content": "Fix the failing test in tests/test_parser.py."}]
    http = []
    with httpx.Client(base_url=url, headers={"X-Episode-Id": "bench"}, timeout=60) as client:
        for i in range(args.turns):
            t0 = time.perf_counter()
            r = client.post("/chat/completions", json={"model": "tiny", "messages": msgs, "tools": TOOLS,
                                                      "temperature": 1.0})
            wall = time.perf_counter() - t0
            r.raise_for_status()
            msg = r.json()["choices"][0]["message"]
            http.append(wall - proxy.session("bench").turn_log[-1]["engine_s"])
            msgs = msgs + [msg] + [{"role": "tool", "tool_call_id": c["id"], "content": observation(i, args.obs_chars)}
                                   for c in msg.get("tool_calls") or []]
    session = proxy.session("bench")
    log = session.turn_log
    traj = proxy.close_episode("bench")
    proxy.stop()
    assert traj.breaks == [] and traj.turns == args.turns, "the synthetic episode broke its own history"

    def at(series, turn):  # median of the 10 turns ending at `turn` (1-based)
        return statistics.median(series[max(0, turn - 10):turn])

    proxy_cpu, proxy_wall = [t["proxy_cpu_s"] for t in log], [t["proxy_s"] for t in log]
    last = args.turns
    p10, pN, h10, hN = at(proxy_cpu, 10), at(proxy_cpu, last), at(http, 10), at(http, last)
    w10, wN = at(proxy_wall, 10), at(proxy_wall, last)
    print(f"episode: {args.turns} turns, {len(msgs)} messages, {traj.num_tokens} tokens "
          f"({log[9]['prompt_tokens']} prompt tokens at turn 10, {log[-1]['prompt_tokens']} at turn {last})")
    print(f"proxy work per turn (cpu):  turn 10 {p10 * 1e3:6.2f} ms   turn {last} {pN * 1e3:6.2f} ms   "
          f"ratio {pN / p10:5.2f}")
    print(f"proxy work per turn (wall): turn 10 {w10 * 1e3:6.2f} ms   turn {last} {wN * 1e3:6.2f} ms   "
          f"ratio {wN / w10:5.2f}")
    print(f"http overhead per turn:     turn 10 {h10 * 1e3:6.2f} ms   turn {last} {hN * 1e3:6.2f} ms   "
          f"ratio {hN / h10:5.2f}"
          f"   (+ JSON of the whole history both ways: O(history) by the protocol)")
    ok = pN < 2 * p10
    print(f"{verdict(ok)}: proxy work at turn {last} is {pN / p10:.2f}x turn 10 (target < 2x)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
