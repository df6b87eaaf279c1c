"""Config section for evaluation and grading (``eval.*``).

``sao eval`` runs the agent of ``checkpoint`` (None: ``model.path``) on ``dataset`` with the
evaluation sampling settings (``temperature`` / ``top_p`` replace ``sampling.*`` for the eval run),
writes ``<run.dir>/eval/<name>/`` and grades there with swebench.
"""
from __future__ import annotations

import re

from pydantic import Field, field_validator

from sao_harness.core.config import Section


class EvalConfig(Section):
    """`sao eval`: the policy, the dataset, the evaluation sampling and the grading."""

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
    grade_timeout_s: float = Field(1800.0, gt=0, description="seconds per swebench run (eval script); tests "
                                   "still running past it are the patch's failure (unresolved, 0), a setup "
                                   "still running is an infra failure")
    grade_output_cap_bytes: int = Field(16_000_000, gt=0, description="test output kept per grading run "
                                        "(official and clean); past it the run is stopped and the patch is "
                                        "unresolved (hack kind output_cap), not an infra failure")
    guard: bool = Field(True, description="strip test-file / test-config changes before grading "
                        "(reward-hacking guard)")
    gold_preflight: bool = Field(False, description="grade the gold patches first and stop if one does not "
                                 "resolve (--gold)")

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", v):
            raise ValueError("use letters, digits, '.', '_' and '-' (it names a directory and swebench run id)")
        return v
