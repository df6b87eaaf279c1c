"""Config section for evaluation (``eval.*``); how a patch is graded is ``grading.*`` (tasks.config).

``sao eval`` runs the agent of ``checkpoint`` (None: ``model.path``) on ``dataset`` with the
evaluation sampling settings (``temperature`` / ``top_p`` replace ``sampling.*`` for the eval run),
writes ``<run.dir>/eval/<name>/`` and grades there with swebench (``grading.*``).
"""
from __future__ import annotations

import re

from pydantic import Field, field_validator

from sao_harness.core.config import Section


class EvalConfig(Section):
    """`sao eval`: the policy, the dataset, the evaluation sampling, and how many instances are graded at once."""

    dataset: str = Field("bundled", description="`bundled`, SWE-bench/SWE-bench_Verified, or a local swebench "
                         "5.x file / task repo; several, comma-separated: a mixed source, reported per dataset")
    split: str = Field("test", description="dataset split")
    instances: list[str] = Field([], description="evaluate only these instance ids (empty = the whole dataset)")
    checkpoint: str | None = Field(None, description="a trainer checkpoint dir (its policy/ subdir is loaded), a "
                                   "model dir, a Hugging Face model id, or `latest` (the newest checkpoint in "
                                   "`<run.dir>/checkpoints`); null = model.path")
    name: str | None = Field(None, description="the eval directory `<run.dir>/eval/<name>`; null = "
                             "`<model>.<dataset>`")
    temperature: float = Field(0.0, ge=0, description="evaluation temperature, replaces sampling.temperature "
                               "(0 = greedy)")
    top_p: float = Field(1.0, gt=0, le=1, description="evaluation top-p, replaces sampling.top_p (1 = off)")
    workers: int | None = Field(None, gt=0, description="episodes run at once; null = rollout.workers")
    max_workers: int = Field(2, gt=0, description="instances graded at once")
    gold_preflight: bool = Field(False, description="grade the gold patches first and stop if one does not "
                                 "resolve (--gold)")

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", v):
            raise ValueError("use letters, digits, '.', '_' and '-' (it names a directory and swebench run id)")
        return v
