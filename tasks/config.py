"""Config section for the task source (``tasks.*``)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from sao_harness.core.config import Section


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
