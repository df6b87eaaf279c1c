"""A small two-turn trajectory with every field set, for the trace and store tests."""
from sao_harness.harness.trace import Segment, Status, Trajectory


def make_traj(task="t1", reward=1.0, status=Status.OK, **kw):
    return Trajectory(task_id=task, status=status, reward=reward, turns=2, patch="diff --git a/x b/x\n", segments=[
        Segment("observation", [1, 2, 3, 4]),
        Segment("action", [5, 6], [-0.5, -1.25], [0, 0]),
        Segment("observation", [7]),
        Segment("action", [8, 9, 10], [-0.1, -0.2, -0.3], [0, 1, 1]),
    ], grading={"resolved": True}, timings={"total_s": 1.5}, metadata={"model": "tiny"}, **kw)
