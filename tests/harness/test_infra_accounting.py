"""Infra errors by kind (harness.infra) and `sao rollout`'s accounting of them: the kinds of the reasons the
code writes, the summary line, and the rollout.max_infra_frac stop. No Docker: fake episodes, typed faults."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from sao_harness.envs.errors import CommandTimeout, ContainerDied, EngineGone, ImageNotFound, OOMKilled, SandboxError
from sao_harness.envs.faults import engine_calls
from sao_harness.envs.pull import ImagePullError
from sao_harness.harness.engines.protocol import EngineTimeout
from sao_harness.harness.episode import EpisodeContext, run_episode
from sao_harness.harness.infra import KINDS, error_kind, infra_kind, kind_of, kinds_line, over_max_infra_frac
from sao_harness.harness.rollout import RolloutStats, TooManyInfraErrors, run_rollout
from sao_harness.harness.runner import run_with_retries
from sao_harness.harness.store import TraceStore
from sao_harness.harness.trace import INFRA_KIND, Status, Trajectory
from sao_harness.sao.config import load_config
from sao_harness.tasks.grading.grade_status import GradeStatus
from tests.support.rollout_stub import stub_rollout


def reason(e: BaseException) -> str:
    """The reason harness.episode and harness.runner write for an exception."""
    return f"{type(e).__name__}: {e}"


def engine_gone() -> EngineGone:
    """The EngineGone that envs.faults makes of a refused Docker connection."""
    with pytest.raises(EngineGone) as caught, engine_calls("starting sandbox sao-1 from img:1"):
        raise ConnectionRefusedError(111, "Connection refused")
    return caught.value


REASONS = [  # (the reason as the code writes it, its kind)
    (reason(engine_gone()), "docker_engine"),
    ("EngineGone: no Docker engine answers (unix:///var/run/docker.sock: refused); start one with `sao docker up`",
     "docker_engine"),
    ("EngineError: docker.host=tcp://10.0.0.9:2375 does not answer (Connection refused)", "docker_engine"),
    ("SandboxUnavailable: cannot inspect container c1: ('Connection aborted.', ConnectionRefusedError(111))",
     "docker_engine"),
    (reason(ImageNotFound("sweb.eval.x86_64.a:latest")), "sandbox_start"),
    (reason(ImagePullError("image i is not on this node's engine and no source gave it: dir:/x: no i.tar")),
     "sandbox_start"),
    ("ScrubError: history scrub of /testbed to 0000 in sao-1 failed (exit 1): fatal: not a commit", "sandbox_start"),
    ("SandboxError: cannot start sandbox from img:1: 500 Server Error: driver failed", "sandbox_start"),
    ("SandboxError: sandbox sao-1: its shell did not start (does img:1 have bash?)", "sandbox_start"),
    (reason(ContainerDied("sandbox sao-1: container exited (exit code 1) while running 'pytest'")), "sandbox_died"),
    ("SandboxUnavailable: container c1 was removed", "sandbox_died"),
    ("SandboxUnavailable: container c1 is not running (exited, exit code 1, oom killed: False)", "sandbox_died"),
    (reason(OOMKilled("sandbox sao-1: container OOM-killed at the memory limit (4g) while running 'make'")),
     "sandbox_oom"),
    ("SandboxUnavailable: container c1 is not running (exited, exit code 137, oom killed: True)", "sandbox_oom"),
    (reason(OSError(28, "No space left on device")), "disk_full"),
    ("SandboxError: cannot start sandbox from img:1: write /var/lib/docker/x: no space left on device", "disk_full"),
    (reason(CommandTimeout("python -m pytest tests", 600)), "timeout"),
    ("LLMServiceUnavailableError: litellm.ServiceUnavailableError: OpenAIException - engine error: dead", "engine"),
    ("LLMTimeoutError: litellm.Timeout: Connection timed out after 600.0 seconds", "engine"),
    ("APIConnectionError: litellm.APIConnectionError: Connection refused", "engine"),
    ("RayActorError: The actor died unexpectedly before finishing this task.", "engine"),
    ("proxy request failed: ConnectError: [Errno 111] Connection refused", "engine"),
    ('proxy answered 503: {"error": {"message": "engine error: the engine core died"}}', "engine"),
    ("EngineError: vllm engine: the engine core died (exit 1)", "engine"),
    (f"grading: {GradeStatus.INFRA_FAILURE}", "grading"),
    ("grading: Docker engine: EngineGone: Docker engine at unix:///x unreachable while grading", "grading"),
    ("injected by the test-bed (testbed.simulated.infra_error_rate)", "other"),
    ("RuntimeError: engine gone", "other"),
    ("unknown", "other"),
    (None, "other"),
]


@pytest.mark.parametrize("why, kind", REASONS)
def test_each_reason_the_code_writes_has_its_kind(why, kind):
    assert infra_kind(why) == kind


def test_every_kind_is_reached_and_none_else():
    assert {kind for _, kind in REASONS} == set(KINDS)


def test_a_typed_fault_is_known_by_its_type_not_its_text():
    """The type decides where it is known (a message that reads otherwise does not move it); else the text."""
    assert error_kind(OOMKilled("sandbox sao-1: a process was killed while running 'curl proxy'")) == "sandbox_oom"
    assert infra_kind("OOMKilled: sandbox sao-1: a process was killed while running 'curl proxy'") == "sandbox_oom"
    assert error_kind(engine_gone()) == "docker_engine"
    assert error_kind(EngineTimeout("no reply in 600 s")) == "engine"  # the inference engine's, not Docker's
    assert error_kind(ContainerDied("gone")) == "sandbox_died"
    assert error_kind(OSError(28, "No space left on device")) == "disk_full"
    assert error_kind(SandboxError("sandbox sao-1 is closed")) == "other"
    assert error_kind(RuntimeError("the sandbox: command timed out")) == "timeout"


def test_the_recorded_kind_wins_over_the_reason():
    assert kind_of({INFRA_KIND: "sandbox_oom", Status.INFRA_ERROR: "RuntimeError: x"}) == "sandbox_oom"
    assert kind_of({Status.INFRA_ERROR: reason(CommandTimeout("sleep 9", 1))}) == "timeout"
    assert kind_of({}) == "other"


def test_run_with_retries_records_the_kind_of_what_escaped():
    def broken(task, ctx, eid):
        raise engine_gone()

    traj = run_with_retries(broken, SimpleNamespace(instance_id="t"), None, 0)
    assert traj.status == Status.INFRA_ERROR and traj.metadata[INFRA_KIND] == "docker_engine"
    assert traj.metadata[Status.INFRA_ERROR].startswith("EngineGone: Docker engine at ")


def test_an_episode_records_the_kind_of_its_sandbox_fault(monkeypatch, tmp_path):
    """run_episode with no Docker engine: an infra_error whose kind comes from the EngineGone it caught."""
    from sao_harness.harness import episode

    def no_engine(cfg):
        raise EngineGone("no Docker engine answers (unix:///nowhere: missing); start one with `sao docker up`")

    class NoProxy:
        base_url = "http://127.0.0.1:9"

        def close_episode(self, episode_id):
            from sao_harness.harness.proxy import UnknownEpisode  # lazy: the one test that needs it

            raise UnknownEpisode(episode_id)

    monkeypatch.setattr(episode, "docker_client", no_engine)
    cfg = load_config(None, [f"run.root={tmp_path}"])
    task = SimpleNamespace(instance_id="t1", image="img:1")
    traj = run_episode(task, EpisodeContext(cfg=cfg, proxy=NoProxy(), run_id="pytest-infra"))
    assert (traj.status, traj.reward, traj.metadata[INFRA_KIND]) == (Status.INFRA_ERROR, None, "docker_engine")


# --- sao rollout ------------------------------------------------------------------------------------------


def infra(task_id: str, why: str) -> Trajectory:
    return Trajectory(task_id=task_id, status=Status.INFRA_ERROR, metadata={Status.INFRA_ERROR: why})


def test_the_summary_gives_infra_errors_by_kind():
    stats = RolloutStats(total=4)
    for traj in (infra("a", reason(engine_gone())), infra("b", reason(CommandTimeout("make", 5))),
                 infra("c", reason(engine_gone())), Trajectory(task_id="d", status=Status.OK, reward=1.0)):
        stats.add(traj)
    assert stats.infra_kinds == {"docker_engine": 2, "timeout": 1}
    assert stats.summary().startswith("summary: 4 episode(s): {'infra_error': 3, 'ok': 1}; resolved 1/1 graded; "
                                      "3 infra error(s) (docker_engine 2, timeout 1) after 0 retries; ")
    assert stats.line().endswith("| infra errors 3 (docker_engine 2, timeout 1)")
    assert "| infra errors 0" in RolloutStats().line() and "retries; " in RolloutStats().summary()


def test_the_stop_rule_waits_for_enough_episodes_and_lists_the_kinds():
    kinds = {"timeout": 5, "docker_engine": 15}
    why = over_max_infra_frac(20, 64, kinds, 0.2, 20, last="EngineGone: Docker engine at x unreachable")
    assert why.startswith("rollout/infra_frac 0.312 is over rollout.max_infra_frac 0.2 after 64 episodes "
                          "(20 infra errors: docker_engine 15, timeout 5); the last: EngineGone: ")
    assert "rollout.max_infra_frac (null: no limit)" in why
    assert over_max_infra_frac(20, 64, kinds, None, 20) is None  # off
    assert over_max_infra_frac(20, 64, kinds, 0.32, 20) is None  # under it
    assert over_max_infra_frac(19, 19, kinds, 0.2, 20) is None  # too few episodes yet
    assert kinds_line({"b": 1, "a": 1, "z": 0}) == "a 1, b 1"


def fake_rollout(monkeypatch, tmp_path, failing: set[int], *overrides, n: int = 40):
    """run_rollout over tasks t0..t<n-1>, one worker, each episode starting once the one before is stored (as
    when episodes take minutes): an infra error (EngineGone) for the indices in `failing`, else ok. Returns (the
    stats or the TooManyInfraErrors raised, the log lines, the store)."""
    tasks = [SimpleNamespace(instance_id=f"t{i}", image="img:1") for i in range(n)]
    gate = threading.Semaphore(1)

    def episode(task, ctx, eid):
        assert gate.acquire(timeout=30)
        if int(task.instance_id[1:]) in failing:
            raise engine_gone()
        return Trajectory(task_id=task.instance_id, traj_id=eid, status=Status.OK, reward=1.0)

    stub_rollout(monkeypatch, episode)
    cfg = load_config(None, [f"run.root={tmp_path}", "run.name=r", "rollout.workers=1", "rollout.max_retries=0",
                             *overrides])
    lines: list[str] = []
    try:
        result = run_rollout(cfg, tasks, engine=object(), proxy=object(), log=lines.append,
                             on_trajectory=lambda traj, shard: gate.release())
    except TooManyInfraErrors as e:
        result = e
    return result, lines, TraceStore(cfg.run.dir)


def test_a_rollout_over_max_infra_frac_stops_keeps_its_traces_and_says_why(monkeypatch, tmp_path):
    every_third = set(range(0, 40, 3))  # 7 of the first 20: 0.35
    err, lines, store = fake_rollout(monkeypatch, tmp_path, every_third)
    assert isinstance(err, TooManyInfraErrors)
    assert str(err).startswith("rollout/infra_frac 0.35 is over rollout.max_infra_frac 0.2 after 20 episodes "
                               "(7 infra errors: docker_engine 7); the last: EngineGone: ")
    stored = list(store)
    assert 20 <= len(stored) <= 21  # no new episode after the 20th; the one running then is stored too
    summary = next(line for line in lines if line.startswith("summary: "))
    assert f"summary: {len(stored)} episode(s)" in summary and " infra error(s) (docker_engine " in summary
    assert any(line.startswith("rollout: stopping, ") for line in lines)
    assert all(t.metadata[INFRA_KIND] == "docker_engine" for t in stored if t.status == Status.INFRA_ERROR)


@pytest.mark.parametrize("override", ["rollout.max_infra_frac=null", "rollout.max_infra_frac=0.4"])
def test_the_same_rollout_under_the_limit_or_without_one_runs_to_the_end(monkeypatch, tmp_path, override):
    stats, lines, store = fake_rollout(monkeypatch, tmp_path, set(range(0, 40, 3)), override)
    assert isinstance(stats, RolloutStats) and stats.done == 40 and len(list(store)) == 40
    assert stats.infra_kinds == {"docker_engine": 14}
    assert not any(line.startswith("rollout: stopping") for line in lines)


def test_a_burst_of_early_failures_does_not_stop_a_rollout(monkeypatch, tmp_path):
    """The first 3 episodes fail (a share of 1.0 at first), then none: 3/20 when the rule first applies."""
    stats, _, store = fake_rollout(monkeypatch, tmp_path, {0, 1, 2})
    assert isinstance(stats, RolloutStats) and stats.done == 40 and stats.infra_errors == 3
