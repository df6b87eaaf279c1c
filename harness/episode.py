"""One episode: task -> sandbox -> OpenHands agent (LLM at the proxy) -> patch -> grade -> trajectory.

Contract of ``run_episode``: it never raises for what goes wrong inside the episode; it returns a
validated ``Trajectory`` whose status says how it ended:
- ``ok``: the agent finished (or stopped) on its own; reward from grading the patch;
- ``truncated_turns`` / ``truncated_context``: the turn limit / token budget ended it; still graded;
- ``agent_error``: the agent loop failed for a reason of its own; no reward;
- ``infra_error``: the sandbox, the engine or the grader failed; no reward, ever (never a 0).
- ``patch_too_large`` / ``disk_exceeded``: over ``sandbox.max_patch_bytes`` / ``sandbox.disk_bytes``;
  ``patch_unavailable``: the sandbox, still running, gave no patch (the agent deleted .git, replaced git,
  ...); the agent's doing, so reward 0 (never an infra_error), not graded.
The reward is the guarded verdict (test-file and test-config changes stripped) from a fresh container.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from sao_harness.core.slots import node_slot
from sao_harness.envs.engine import docker_client
from sao_harness.envs.errors import SandboxError
from sao_harness.envs.limits import DiskLimitExceeded, PatchTooLarge, PatchUnavailable
from sao_harness.envs.pull import ensure_image
from sao_harness.envs.sandbox import Sandbox
from sao_harness.harness.agent import AgentSettings, run_agent
from sao_harness.harness.config import HarnessConfig
from sao_harness.harness.infra import error_kind
from sao_harness.harness.prompts import instruction_for
from sao_harness.harness.proxy import UnknownEpisode
from sao_harness.harness.trace import GRADED, INFRA_KIND, Status, Trajectory
from sao_harness.tasks.grading.grade import grade
from sao_harness.tasks.images.scrub import sandbox_image

LIMIT_STATUS = {PatchTooLarge: Status.PATCH_TOO_LARGE, PatchUnavailable: Status.PATCH_UNAVAILABLE,
                DiskLimitExceeded: Status.DISK_EXCEEDED}  # the agent's doing: reward 0


@dataclass
class EpisodeContext:
    """What every episode of a run shares."""

    cfg: HarnessConfig
    proxy: object  # harness.proxy.ProxyServer, started
    run_id: str
    grade: bool = True  # False: leave the reward to the caller (e.g. eval grades in bulk)
    draw: str | None = None  # what a test-bed draws its episode from: one key per sync group (its G rollouts
    # face the same draw, as a group's rollouts of one task do), one per assignment in async; None: the episode id


def new_episode_id(task_id: str) -> str:
    return f"{task_id}.{uuid.uuid4().hex[:12]}"


def _status(agent_result, traj: Trajectory | None, sandbox_error: str | None) -> Status:
    """Precedence: infrastructure first, then the proxy's context budget, then how the agent ended."""
    if sandbox_error is not None or agent_result is None:
        return Status.INFRA_ERROR
    agent_status = agent_result.status
    if agent_status == Status.INFRA_ERROR:
        return Status.INFRA_ERROR
    if traj is not None and traj.status == Status.TRUNCATED_CONTEXT:
        return Status.TRUNCATED_CONTEXT
    return agent_status


def run_episode(task, ctx: EpisodeContext, episode_id: str | None = None) -> Trajectory:
    """Run ``task`` (a ``tasks.model.Task``) once; see the module doc."""
    cfg = ctx.cfg
    episode_id = episode_id or new_episode_id(task.instance_id)
    timings: dict[str, float] = {}
    t_start = time.monotonic()
    agent_result, patch, sandbox_error, sandbox_kind, limit = None, "", None, None, None
    try:
        client = docker_client(cfg.docker)  # this node's engine
        ensure_image(task.image, cfg.docker, client)  # pull on a miss (envs.pull); ImagePullError
        image, scrubbed = sandbox_image(client, task, cfg.sandbox, cfg.docker)  # no history after base_commit
        if scrubbed is not None:  # the first sandbox of this image here (tasks.scrub; ScrubError: infra_error)
            timings["scrub_s"] = scrubbed.seconds
        t0 = time.monotonic()
        with Sandbox(image, cfg.sandbox, client=client, run_id=ctx.run_id,
                     labels={"sao-harness.task": task.instance_id}) as sb:
            timings["sandbox_wait_s"] = sb.start_wait_s  # for a start slot (sandbox.start_slots)
            timings["sandbox_start_s"] = time.monotonic() - t0 - sb.start_wait_s
            if task.episode_setup:  # the dataset's own episode start (tasks.formats.adapters: R2E-Gym hides tests)
                sb.run(task.episode_setup, timeout_s=120, check=True)
            t0 = time.monotonic()
            agent_result = run_agent(
                sb, base_url=ctx.proxy.base_url, instruction=instruction_for(task.problem_statement, task.base_commit,
                                                                        profile=cfg.agent.profile),
                episode_id=episode_id, task_id=task.instance_id, settings=AgentSettings.from_config(cfg))
            timings["agent_s"] = time.monotonic() - t0
            if sb.disk_exceeded is not None:  # the watchdog killed the sandbox during the agent's run
                limit = (Status.DISK_EXCEEDED, f"{sb.disk_exceeded} bytes on disk, over sandbox.disk_bytes")
            elif agent_result.status != Status.INFRA_ERROR:
                t0 = time.monotonic()
                try:
                    patch = sb.diff(task.base_commit)
                except tuple(LIMIT_STATUS) as e:  # the agent's doing, not infrastructure
                    limit = (next(s for cls, s in LIMIT_STATUS.items() if isinstance(e, cls)), str(e))
                timings["diff_s"] = time.monotonic() - t0
    except SandboxError as e:
        sandbox_error, sandbox_kind = f"{type(e).__name__}: {e}", error_kind(e)
    except Exception as e:  # noqa: BLE001  (docker-py / OS trouble around the sandbox is infrastructure too)
        sandbox_error, sandbox_kind = f"{type(e).__name__}: {e}", error_kind(e)

    try:
        traj = ctx.proxy.close_episode(episode_id)
    except UnknownEpisode:  # the model was never called (e.g. the sandbox did not start)
        traj = Trajectory(task_id=task.instance_id)
    traj.traj_id = episode_id
    traj.task_id = task.instance_id
    traj.status = _status(agent_result, traj, sandbox_error)
    traj.patch = patch
    traj.reward = None
    if limit is not None:  # over a sandbox limit: reward 0, never an infra_error
        traj.status, traj.reward, traj.metadata["limit"] = limit[0], 0.0, limit[1]
    traj.metadata["episode_id"] = episode_id
    traj.metadata["run_id"] = ctx.run_id
    if agent_result is not None:
        traj.metadata["agent"] = agent_result.to_dict()
        traj.turns = max(traj.turns, agent_result.iterations)
    if sandbox_error is not None:  # the exception's type gives the kind (harness.infra); other reasons are parsed
        traj.metadata[Status.INFRA_ERROR], traj.metadata[INFRA_KIND] = sandbox_error, sandbox_kind
    elif traj.status == Status.INFRA_ERROR:
        traj.metadata[Status.INFRA_ERROR] = agent_result.error if agent_result else "unknown"

    if ctx.grade and traj.status in GRADED:
        with node_slot("grade", cfg.grading.slots()) as waited:  # gradings at once on this node are bounded
            timings["grade_wait_s"] = waited
            t0 = time.monotonic()
            result = grade(task, patch, timeout=cfg.grading.timeout_s, guard=cfg.grading.guard,
                           log_root=cfg.run.dir / "grading", sandbox=cfg.sandbox,
                           output_cap_bytes=cfg.grading.output_cap_bytes)
            timings["grade_s"] = time.monotonic() - t0
        traj.grading = result.to_dict()
        traj.metadata["hack_kinds"] = list(result.hack_kinds)  # reward-hacking attempts the guard found
        if result.reward is None:  # the grader failed: infrastructure, not a 0
            traj.status = Status.INFRA_ERROR
            traj.metadata[Status.INFRA_ERROR] = f"grading: {result.error or result.status}"
        else:
            traj.reward = float(result.reward)
    timings["episode_s"] = time.monotonic() - t_start
    traj.timings = {**traj.timings, **timings}
    return traj.validate()
