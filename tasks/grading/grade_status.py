"""A grade's verdict on a patch: the status of ``tasks.grading.grade.GradeResult`` (official and guarded) and
of the clean run (``tasks.grading.clean_run``). Not an episode's status (``harness.trace.Status``)."""
from __future__ import annotations

from enum import StrEnum


class GradeStatus(StrEnum):
    """The verdict (grades.jsonl and the reports hold the value); the guarded one sets the reward."""

    RESOLVED = "resolved"  # every FAIL_TO_PASS and PASS_TO_PASS test passes: reward 1
    UNRESOLVED = "unresolved"  # a test fails, runs past the timeout, or a hack was found: reward 0
    EMPTY = "empty"  # nothing to grade (no patch, or every file of it a hacking attempt): reward 0
    NO_APPLY = "patch_does_not_apply"  # neither git apply nor patch takes it: reward 0
    INFRA_FAILURE = "infra_failure"  # the grader failed (Docker, a missing image, a hang): no verdict, no reward

    def __repr__(self) -> str:
        return repr(self.value)  # logs and messages print 'resolved', as when verdicts were plain strings


INFRA_FAILURES = "infra_failures"  # the reports' key (and count) of the instances without a verdict
