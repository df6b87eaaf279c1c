"""End to end: OpenHands episodes in Docker through the token-exact proxy, graded by swebench.

Real engine (Docker), real SDK, real swebench; the policy is the scripted test double (to prove the
path to `resolved`) or the tiny model.
"""
from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from sao_harness.core.errors import UserError
from sao_harness.harness.engines.scripted_policy import ScriptedPolicyEngine, tool_call
from sao_harness.harness.episode import run_episode
from sao_harness.harness.proxy import ProxyServer
from sao_harness.harness.rollout import run_rollout
from sao_harness.harness.runner import episode_function, run_with_retries
from sao_harness.harness.runner import load_tasks as run_tasks
from sao_harness.harness.store import TraceStore
from sao_harness.harness.trace import Status, Trajectory
from sao_harness.sao.config import load_config
from sao_harness.tasks.formats.loaders import load_tasks

pytestmark = pytest.mark.docker

TASK = "sao-harness__minicfg-8"
TASK2 = "sao-harness__spanlib-5"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def make_cfg(project_root, tmp_path, *overrides):
    return load_config(project_root / "configs/local.yaml", [
        f"run.root={tmp_path}", "run.name=r", "sampling.max_tokens=4096", "agent.stuck_detection=false",
        f"model.cache_dir={project_root / '.cache/sao'}", *overrides])


class Recording(ScriptedPolicyEngine):
    """Records every id it emits, per call, to compare with the trace."""

    def __init__(self, *a, on_call=None, **kw):
        super().__init__(*a, **kw)
        self.emitted: list[list[int]] = []
        self.on_call = on_call

    def generate(self, prompt_ids, sampling, timeout=None):
        if self.on_call is not None:
            self.on_call(self.calls)
        result = super().generate(prompt_ids, sampling, timeout)
        self.emitted.append(list(result.token_ids))
        return result


def rollout(cfg, engine, tokenizer):
    """As `sao rollout` runs: the config's tasks loaded and pre-flighted once, then the rollout over them."""
    proxy = ProxyServer(engine, tokenizer, cfg)
    proxy.start(port=0)
    try:
        return run_rollout(cfg, run_tasks(cfg, "swe", log=lambda *_: None), engine=engine, proxy=proxy,
                           log=lambda *_: None)
    finally:
        proxy.stop()


def test_scripted_gold_episode_resolves_and_trace_is_what_the_engine_emitted(docker_engine, project_root, tmp_path,
                                                                             tokenizer):
    cfg = make_cfg(project_root, tmp_path, f"tasks.instances=[{TASK}]", "rollout.workers=1")
    tasks = load_tasks("bundled", instances=[TASK])
    engine = Recording.gold(tokenizer, tasks)
    stats = rollout(cfg, engine, tokenizer)
    assert stats.done == 1 and stats.resolved == 1
    [traj] = list(TraceStore(cfg.run.dir))
    assert traj.status == Status.OK and traj.reward == 1.0
    assert traj.grading["resolved_official"] is True and traj.grading["resolved_guarded"] is True
    assert "minicfg" in traj.patch and traj.patch.startswith("diff --git")
    actions = [s for s in traj.segments if s.kind == "action"]
    assert [s.token_ids for s in actions] == engine.emitted  # exactly the sampled ids, turn by turn
    assert all(lp == 0.0 for s in actions for lp in s.logp_rollout)
    assert traj.turns == len(engine.emitted) and traj.breaks == []
    assert traj.segments[0].kind == "observation" and traj.segments[-1].kind == "action"


def test_turn_limit_gives_truncated_turns(docker_engine, project_root, tmp_path, tokenizer):
    cfg = make_cfg(project_root, tmp_path, f"tasks.instances=[{TASK}]", "rollout.workers=1", "agent.max_iterations=3")
    tasks = load_tasks("bundled", instances=[TASK])
    replies = [tool_call("terminal", {"command": f"echo step {i}"}) for i in range(10)]
    engine = ScriptedPolicyEngine(tokenizer, {TASK: replies}, {TASK: tasks[0].problem_statement})
    rollout(cfg, engine, tokenizer)
    [traj] = list(TraceStore(cfg.run.dir))
    assert traj.status == Status.TRUNCATED_TURNS
    assert traj.turns == 3
    assert traj.reward == 0.0  # graded: an empty patch resolves nothing


def test_container_killed_mid_episode_is_infra_error_without_reward(docker_engine, project_root, tmp_path, tokenizer):
    from sao_harness.envs.engine import docker_client

    cfg = make_cfg(project_root, tmp_path, f"tasks.instances=[{TASK}]", "rollout.workers=1", "rollout.max_retries=1")
    tasks = load_tasks("bundled", instances=[TASK])
    replies = [tool_call("terminal", {"command": f"echo step {i}"}) for i in range(10)]

    def kill_on_second_call(calls):
        if calls in (1, 3):  # each attempt's second turn (2 calls per attempt): kill its sandbox from outside
            for c in docker_client().containers.list(filters={"label": f"sao-harness.task={TASK}"}):
                c.kill()

    engine = Recording(tokenizer, {TASK: replies}, {TASK: tasks[0].problem_statement}, on_call=kill_on_second_call)
    engine.calls = 0
    stats = rollout(cfg, engine, tokenizer)
    [traj] = list(TraceStore(cfg.run.dir))  # the last attempt is recorded, once
    assert traj.status == Status.INFRA_ERROR and traj.reward is None
    assert traj.metadata["attempt"] == 1 and stats.retries == 1 and stats.infra_errors == 1
    assert traj.grading is None  # never graded, never a 0
    assert Status.INFRA_ERROR in traj.metadata


@pytest.mark.parametrize("attack", ["rm -rf /testbed/.git", "printf '#!/bin/sh\\necho 7\\n' > /usr/local/bin/wc && "
                                               "chmod +x /usr/local/bin/wc"])
def test_an_agent_that_breaks_the_patch_extraction_gets_zero_not_infra(docker_engine, project_root, tmp_path,
                                                                       tokenizer, attack):
    """Failing, the agent deletes .git or plants a lying wc so that no patch can be read: that must not
    turn its 0 into an infra_error (no reward, left out of training and of resolved@1)."""
    cfg = make_cfg(project_root, tmp_path, f"tasks.instances=[{TASK}]", "rollout.workers=1", "rollout.max_retries=1")
    tasks = load_tasks("bundled", instances=[TASK])
    replies = [tool_call("terminal", {"command": attack}), tool_call("finish", {"message": "done"})]
    engine = ScriptedPolicyEngine(tokenizer, {TASK: replies}, {TASK: tasks[0].problem_statement})
    stats = rollout(cfg, engine, tokenizer)
    [traj] = list(TraceStore(cfg.run.dir))
    assert (traj.status, traj.reward) == (Status.PATCH_UNAVAILABLE, 0.0), traj.metadata
    assert stats.retries == 0 and stats.infra_errors == 0 and "no patch" in traj.metadata["limit"]


def test_an_agent_that_removes_bash_is_graded_not_infra(docker_engine, project_root, tmp_path, tokenizer):
    """With bash gone no new shell starts and the file editor cannot read: errors the agent sees. The
    episode ends as its own and its patch is graded (0 here), never an infra_error."""
    cfg = make_cfg(project_root, tmp_path, f"tasks.instances=[{TASK}]", "rollout.workers=1", "rollout.max_retries=1")
    tasks = load_tasks("bundled", instances=[TASK])
    replies = [tool_call("terminal", {"command": "mv /usr/bin/bash /tmp/b; exit"}),
               tool_call("terminal", {"command": "echo after"}),
               tool_call("file_editor", {"command": "view", "path": "/testbed"}),
               tool_call("finish", {"message": "done"})]
    engine = ScriptedPolicyEngine(tokenizer, {TASK: replies}, {TASK: tasks[0].problem_statement})
    stats = rollout(cfg, engine, tokenizer)
    [traj] = list(TraceStore(cfg.run.dir))
    assert (traj.status, traj.reward) == (Status.OK, 0.0), traj.metadata
    assert traj.grading is not None and stats.retries == 0 and stats.infra_errors == 0


def test_tiny_model_rollout_writes_valid_traces_and_resumes(docker_engine, project_root, tmp_path):
    """`sao rollout` with the tiny model (hf engine) on two tasks; a second invocation resumes."""
    run = lambda: subprocess.run(
        [sys.executable, "-m", "sao_harness.sao.cli",
         "rollout", "--config", "configs/local.yaml", f"run.root={tmp_path}",
         "run.name=tiny", f"tasks.instances=[{TASK}, {TASK2}]", "agent.max_iterations=3", "sampling.max_tokens=48"],
        cwd=project_root, capture_output=True, text=True, timeout=600)
    first = run()
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert "summary: 2 episode(s)" in first.stdout
    store = TraceStore(tmp_path / "tiny")
    trajs = list(store)
    assert sorted(t.task_id for t in trajs) == [TASK, TASK2]
    for t in trajs:
        assert t.status in (Status.OK, Status.TRUNCATED_TURNS, Status.AGENT_ERROR), t.metadata
        assert t.num_action_tokens > 0 and t.versions == [0]
        assert all(lp <= 0 for s in t.segments if s.kind == "action" for lp in s.logp_rollout)
    show = subprocess.run([sys.executable, "-m", "sao_harness.sao.cli", "trace", "show", str(store.shards()[0])],
                          cwd=project_root, capture_output=True, text=True, timeout=120)
    assert show.returncode == 0 and "[ACTION" in show.stdout and "<|im_start|>system" in show.stdout
    second = run()
    assert second.returncode == 0, second.stderr[-2000:]
    assert "2 episode(s) already in the trace store" in second.stdout
    assert len(store.shards()) == 2


def test_run_with_retries_retries_infra_errors_only_and_never_rewards_them():
    """The one retry loop (`sao rollout` and the trainer's workers): an exception or an infra_error is
    retried with a new episode id, recorded without reward; the first other ending stops it; the
    last allowed attempt is marked; `stop()` ends it before an attempt. No Docker needed."""
    task = SimpleNamespace(instance_id="t")
    ids: list[str] = []

    def flaky(task, ctx, eid):
        ids.append(eid)
        if len(ids) == 1:
            raise RuntimeError("engine gone")
        if len(ids) == 2:
            return Trajectory(task_id=task.instance_id, traj_id=eid, status=Status.INFRA_ERROR,
                              metadata={Status.INFRA_ERROR: "x"})
        return Trajectory(task_id=task.instance_id, traj_id=eid, status=Status.OK, reward=1.0)

    seen: list[Trajectory] = []
    started: list[str] = []
    last = run_with_retries(flaky, task, None, 5, on_start=started.append, on_attempt=seen.append)
    assert [t.status for t in seen] == [Status.INFRA_ERROR, Status.INFRA_ERROR, Status.OK] and last is seen[-1]
    assert [t.metadata["attempt"] for t in seen] == [0, 1, 2]
    assert [t.metadata["last_attempt"] for t in seen] == [False, False, True]
    assert [t.reward for t in seen] == [None, None, 1.0]
    assert seen[0].metadata[Status.INFRA_ERROR] == "RuntimeError: engine gone" and seen[0].traj_id == ids[0]
    assert started == ids and len(set(ids)) == 3

    def broken(task, ctx, eid):
        return Trajectory(task_id=task.instance_id, traj_id=eid, status=Status.INFRA_ERROR)

    seen.clear()
    last = run_with_retries(broken, task, None, 1, on_attempt=seen.append)
    assert [t.metadata["last_attempt"] for t in seen] == [False, True] and last.reward is None
    assert run_with_retries(flaky, task, None, 3, stop=lambda: True) is None

    assert episode_function("swe") is run_episode
    with pytest.raises(UserError, match="no episode function"):
        episode_function("no-such-env")
