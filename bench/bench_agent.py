"""Per-turn overhead of the agent harness outside the engine: OpenHands SDK + tools in a Docker sandbox.

A scripted 50-turn episode (terminal commands, file_editor views and edits, then finish) against the
fake OpenAI-compatible server of the tests (replies in ~1 ms), native and prompt tool modes, plus a
50-turn episode with the SDK's no-op ``think`` tool only (SDK + HTTP cost without a sandbox).
Prints medians per tool and per turn. Needs a Docker engine and the base image (``make docker``).
Run: ``.venv/bin/python bench/bench_agent.py [--turns 50]``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import _common  # noqa: F401  (puts the checkout on sys.path)

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def script(turns: int, call):
    """``turns`` tool calls cycling through typical agent actions, then finish."""
    steps = []
    for i in range(turns):
        k = i % 5
        if k == 0:
            steps.append(call("terminal", command=f"grep -rn 'value' /testbed --include=*.py | head -5 # {i}"))
        elif k == 1:
            steps.append(call("file_editor", command="view", path="/testbed/mod.py"))
        elif k == 2:
            steps.append(call("file_editor", command="str_replace", path="/testbed/mod.py",
                              old_str=f"value = {i - 2}", new_str=f"value = {i}"))
        elif k == 3:
            steps.append(call("terminal", command=f"python3 -c 'import mod; print(mod.value)' # {i}"))
        else:
            steps.append(call("terminal", command=f"cd /testbed && git status --short && ls | wc -l # {i}"))
    return steps + [call("finish", message="done")]


class Clock:
    """Conversation callback timing each action -> observation (tool) and observation -> action (SDK+LLM)."""

    def __init__(self):
        self.tool: dict[str, list[float]] = {}
        self.between: list[float] = []
        self._t_action = None
        self._t_obs = None
        self._tool = None

    def __call__(self, event):
        from sao_harness.harness.agent import load_sdk

        sdk = load_sdk()
        now = time.perf_counter()
        if isinstance(event, sdk["ActionEvent"]):
            if self._t_obs is not None:
                self.between.append(now - self._t_obs)
            self._t_action, self._tool = now, event.tool_name
        elif isinstance(event, (sdk["ObservationEvent"], sdk["AgentErrorEvent"])) and self._t_action is not None:
            self.tool.setdefault(self._tool, []).append(now - self._t_action)
            self._t_obs, self._t_action = now, None


def ms(xs):
    return f"{statistics.median(xs) * 1000:7.1f} ms (n={len(xs)})" if xs else "      - "


def episode(sb, turns: int, native: bool):
    from sao_harness.harness.agent import AgentSettings, run_agent
    from tests.support.fakellm import FakeLLM, prompt_call, tool

    sb.run("cd /testbed && printf 'value = 0\\n' > mod.py && git add -A && git commit -q --allow-empty -m mod", 60,
           check=True)
    clock = Clock()
    with FakeLLM(script(turns, tool if native else prompt_call)) as f:
        t0 = time.perf_counter()
        r = run_agent(sb, base_url=f.base_url, instruction="Bench.", episode_id="bench", task_id="bench",
                      settings=AgentSettings(native_tool_calling=native, stuck_detection=False,
                                             max_iterations=turns + 5), callbacks=[clock])
        wall = time.perf_counter() - t0
    assert r.finished and r.iterations == turns + 1, r
    return r, wall, clock


def think_only(turns: int):
    from sao_harness.harness.agent import AgentSettings, run_agent
    from tests.support.fakellm import FakeLLM, tool

    class NoTools:
        def tool_specs(self):
            return []

        def close(self):
            pass

    clock = Clock()
    with FakeLLM([tool("think", thought=f"thought {i}") for i in range(turns)] + [tool("finish", message="x")]) as f:
        t0 = time.perf_counter()
        r = run_agent(None, base_url=f.base_url, instruction="Bench.", episode_id="b", task_id="b",
                      settings=AgentSettings(stuck_detection=False, max_iterations=turns + 5), tools=NoTools(),
                      callbacks=[clock])
        wall = time.perf_counter() - t0
    assert r.finished, r
    return wall, clock


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=50)
    args = ap.parse_args()

    t0 = time.perf_counter()
    from sao_harness.harness.agent import load_sdk

    load_sdk()
    t_import = time.perf_counter() - t0
    from sao_harness.envs.config import DockerConfig, SandboxConfig
    from sao_harness.envs.engine import ensure_engine
    from sao_harness.envs.images import ensure_base_image
    from sao_harness.envs.sandbox import Sandbox
    from sao_harness.harness.tools import SandboxTarget, SandboxTools

    client = ensure_engine(DockerConfig())
    image = ensure_base_image(client, DockerConfig())
    print(f"agent bench: {args.turns}-turn scripted episodes, fake LLM server, image {image}")
    print(f"  SDK import (once per process)           {t_import:7.2f} s")
    with Sandbox(image, SandboxConfig(), client=client) as sb:
        sb.run("mkdir -p /testbed && cd /testbed && git init -q && git commit -q --allow-empty -m base", 60,
               check=True)
        starts = []
        for _ in range(5):
            t = time.perf_counter()
            tools = SandboxTools(SandboxTarget.from_sandbox(sb))
            starts.append(time.perf_counter() - t)
            tools.close()
        print(f"  sandbox tools start (shell in container) {statistics.median(starts) * 1000:7.1f} ms (median of 5)")
        wall_think, clock_think = think_only(args.turns)
        sdk_turn = statistics.median(clock_think.between)
        print(f"  SDK + HTTP per turn, no sandbox (think)  {ms(clock_think.between)}; episode {wall_think:.2f} s")
        for native in (True, False):
            r, wall, clock = episode(sb, args.turns, native)
            mode = "native" if native else "prompt"
            print(f"  [{mode}] episode wall {wall:6.2f} s = {wall / r.iterations * 1000:6.1f} ms per turn "
                  f"({r.iterations} LLM turns)")
            for name in ("terminal", "file_editor"):
                print(f"  [{mode}]   {name:<12} tool exec        {ms(clock.tool.get(name, []))}")
            print(f"  [{mode}]   SDK + LLM round trip         {ms(clock.between)}")
            tools_ms = 1000 * sum(sum(v) for k, v in clock.tool.items() if k != "finish") / max(1, r.iterations - 1)
            print(f"  [{mode}]   harness overhead per turn    {(wall / r.iterations) * 1000:7.1f} ms "
                  f"(tool exec {tools_ms:.1f} ms + SDK/HTTP {statistics.median(clock.between) * 1000:.1f} ms)")
    print(f"  reference: SDK+HTTP alone {sdk_turn * 1000:.1f} ms per turn; "
          f"target: harness overhead << engine generation time per turn")


if __name__ == "__main__":
    main()
