"""Config section for evaluation and grading (``eval.*``)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class EvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    dataset: str = "bundled"  # or SWE-bench/SWE-bench_Verified, or a local swebench 5.x file / task repo
    split: str = "test"
    checkpoint: str | None = None  # a trainer checkpoint dir; None = model.path
    temperature: float = Field(0.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_workers: int = Field(2, gt=0)  # instances graded at once
    grade_timeout_s: float = Field(1800.0, gt=0)  # per swebench run (eval script), an infra failure past it
    guard: bool = True  # strip test-file / test-config changes before grading (reward-hacking guard)
