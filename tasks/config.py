"""Config section for the task source (``tasks.*``)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class TasksConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # "bundled" = the project's task repo (tasks/bundled); a swebench task-repo directory; a local
    # .jsonl/.json/.parquet file or save_to_disk dir; or a Hugging Face dataset id (e.g.
    # SWE-bench/SWE-bench_Verified) where the hub is reachable.
    source: str = "bundled"
    split: str = "test"
    # Row schema: auto-detected, or one of the training sets whose columns differ from SWE-bench.
    adapter: Literal["auto", "swebench", "swe-gym", "swe-smith", "swe-bench-extra"] = "auto"
    instances: list[str] = []  # empty = all
