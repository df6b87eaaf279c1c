"""Config section for evaluation and grading (``eval.*``).

``sao eval`` runs the agent of ``checkpoint`` (None: ``model.path``) on ``dataset`` with the
evaluation sampling settings (``temperature`` / ``top_p`` replace ``sampling.*`` for the eval run),
writes ``<run.dir>/eval/<name>/`` and grades there with swebench.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


class EvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    dataset: str = "bundled"  # or SWE-bench/SWE-bench_Verified, or a local swebench 5.x file / task repo
    split: str = "test"
    instances: list[str] = []  # evaluate only these instance ids (empty = the whole dataset)
    # a trainer checkpoint dir (its policy/ subdir is loaded), a model dir, a Hugging Face model id,
    # or "latest" (the newest checkpoint in <run.dir>/checkpoints); None = model.path
    checkpoint: str | None = None
    name: str | None = None  # the eval directory <run.dir>/eval/<name>; None = "<model>.<dataset>"
    temperature: float = Field(0.0, ge=0)  # 0 = greedy
    top_p: float = Field(1.0, gt=0, le=1)
    workers: int | None = Field(None, gt=0)  # episodes at once; None = rollout.workers
    max_workers: int = Field(2, gt=0)  # instances graded at once
    grade_timeout_s: float = Field(1800.0, gt=0)  # per swebench run (eval script), an infra failure past it
    guard: bool = True  # strip test-file / test-config changes before grading (reward-hacking guard)
    gold_preflight: bool = False  # grade the gold patches first and stop if one does not resolve (--gold)

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str | None) -> str | None:
        import re

        if v is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", v):
            raise ValueError("use letters, digits, '.', '_' and '-' (it names a directory and swebench run id)")
        return v
