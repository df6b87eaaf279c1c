"""A sandbox with a small git repository in /testbed, for the agent tests."""
from __future__ import annotations

from sao_harness.envs.config import SandboxConfig
from sao_harness.envs.sandbox import Sandbox


def make_repo_sandbox(engine):
    """``engine`` = (docker client, base image) from the `agent_engine` fixture."""
    client, image = engine
    sb = Sandbox(image, SandboxConfig(memory="1g"), client=client)
    sb.run("mkdir -p /testbed/sub && cd /testbed && git init -q && printf 'x = 1\\n' > a.py && touch sub/b.py "
           "&& git add -A && git commit -qm base", 60, check=True)
    return sb
