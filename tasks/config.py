"""Config sections of the tasks layer: the task source (``tasks.*``) and grading (``grading.*``)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from sao_harness.core.config import Section
from sao_harness.core.slots import slots_or_per_core


class TasksConfig(Section):
    """Where the training tasks come from and which of them to use."""

    source: str = Field("bundled", description="`bundled` (the project's task repo, tasks/bundled), a swebench "
                        "task-repo directory, a local .jsonl / .json / .parquet file or save_to_disk directory, "
                        "or a Hugging Face dataset id (e.g. SWE-bench/SWE-bench_Verified) where the hub is reachable; "
                        "several, comma-separated, make one mixed source")
    split: str = Field("test", description="dataset split")
    adapter: Literal["auto", "swebench", "swe-gym", "swe-smith", "r2e-gym", "swe-rebench", "swe-bench-extra"] = Field(
        "auto", description="row schema: detected from the columns (auto), or one of the training sets whose "
        "columns differ from SWE-bench (docs/datasets.md)")
    instances: list[str] = Field([], description="use only these instance ids (empty = all)")
    skip_ungradable: bool = Field(False, description="rollout/train/eval: go on with the usable tasks when some "
                                  "are not (invalid row, not gradable, image missing); false: stop before the first "
                                  "episode, exit 2")


class GradingConfig(Section):
    """How a patch is graded (tasks.grading.grade): the reward of an episode and the verdict of `sao eval` alike."""

    timeout_s: float = Field(1800.0, gt=0, description="seconds per swebench run (eval script); tests still "
                             "running past it are the patch's failure (unresolved, 0), a setup still running is "
                             "an infra failure")
    output_cap_bytes: int = Field(16_000_000, gt=0, description="test output kept per grading run (official and "
                                  "clean); past it the run is stopped and the patch is unresolved (hack kind "
                                  "output_cap), not an infra failure")
    guard: bool = Field(True, description="strip test-file / test-config changes before grading (reward-hacking "
                        "guard)")
    node_slots: int = Field(0, ge=0, description="gradings at once on one node, across its processes "
                            "(core.slots); an episode past them waits for a slot (timings.grade_wait_s) with its "
                            "sandbox already gone; 0: two per CPU core of the node")

    def slots(self) -> int:
        """``node_slots``, or two per CPU core of this node when it is 0."""
        return slots_or_per_core(self.node_slots, 2)
