"""The task model: one SWE-bench 5.x row, validated, with errors that name the instance and field.

A row carries the classic SWE-bench columns (``instance_id, repo, base_commit, patch, test_patch,
problem_statement, hints_text, version, FAIL_TO_PASS, PASS_TO_PASS, ...``) and, in swebench 5.x,
what grading needs: ``image, eval_script, log_parser, eval_type``. ``FAIL_TO_PASS`` /
``PASS_TO_PASS`` may be JSON strings (classic SWE-bench) or lists; ``Task`` holds lists.

A task without ``image``/``eval_script``/``log_parser``/``eval_type`` is still loadable (an agent can
read it) but not gradable here: ``Task.grading_gaps()`` says what is missing and, from the adapter's
notes (``"<field>: why"``), why; ``Task.require_gradable()`` raises it as one line naming the row and
the first missing field. ``Task.adapter`` names the adapter that mapped the row (``tasks.formats.adapters``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sao_harness.core.errors import UserError

REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement", "FAIL_TO_PASS", "PASS_TO_PASS")
TEXT_FIELDS = ("patch", "test_patch", "hints_text", "version")
GRADING_FIELDS = ("image", "eval_script", "log_parser", "eval_type")
EVAL_TYPES = ("pass_and_fail", "fail_only")
KNOWN = set(REQUIRED) | set(TEXT_FIELDS) | set(GRADING_FIELDS) | {"difficulty", "split", "episode_setup"}


class TaskError(UserError):
    """A malformed task row: ``task ID: field 'NAME': what is wrong``."""

    def __init__(self, instance_id: str | None, field_name: str | None, message: str):
        where = f"task {instance_id or '?'}"
        if field_name:
            where += f": field '{field_name}'"
        super().__init__(f"{where}: {message}")
        self.instance_id = instance_id
        self.field = field_name


def parser_registry() -> dict:
    """swebench's log parsers by name (imported lazily: swebench is heavy)."""
    from swebench.harness.log_parsers import PARSER_REGISTRY  # lazy: swebench is heavy

    return PARSER_REGISTRY


def _test_list(iid: str, name: str, value: Any) -> list[str]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise TaskError(iid, name, f"not valid JSON ({e.msg} at char {e.pos}): {value[:60]!r}") from None
    if hasattr(value, "tolist"):  # numpy / pyarrow arrays from parquet
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise TaskError(iid, name, f"must be a list of test names (or its JSON text), got {type(value).__name__}")
    if not all(isinstance(t, str) for t in value):
        raise TaskError(iid, name, "holds something that is not a string")
    return list(value)


@dataclass
class Task:
    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str]
    patch: str = ""
    test_patch: str = ""
    hints_text: str = ""
    version: str = ""
    image: str | None = None
    eval_script: str | None = None
    log_parser: str | None = None
    eval_type: str | None = None
    difficulty: str | None = None
    split: str | None = None
    episode_setup: str | None = None  # bash run in the sandbox before the agent starts (R2E-Gym hides its tests)
    extra: dict[str, Any] = field(default_factory=dict)  # every other column, kept verbatim
    notes: list[str] = field(default_factory=list)  # what an adapter could not map ("<field>: why")
    adapter: str | None = None  # the adapter that mapped the row (tasks.formats.adapters)
    source: str | None = None  # the task source it was loaded from (one part of a mixed tasks.source)

    @property
    def id(self) -> str:
        return self.instance_id

    @classmethod
    def from_row(cls, row: dict[str, Any], notes: list[str] | None = None) -> Task:
        """Validate ``row`` (a swebench-shaped dict); raise ``TaskError`` naming instance and field."""
        if not isinstance(row, dict):
            raise TaskError(None, None, f"row is a {type(row).__name__}, not a mapping")
        iid = row.get("instance_id")
        if not isinstance(iid, str) or not iid.strip():
            raise TaskError(None, "instance_id", f"missing or not a non-empty string (got {iid!r})")
        for name in REQUIRED:
            if row.get(name) is None:
                raise TaskError(iid, name, "missing")
        for name in ("repo", "base_commit", "problem_statement"):
            if not isinstance(row[name], str):
                raise TaskError(iid, name, f"must be a string, got {type(row[name]).__name__}")
        f2p = _test_list(iid, "FAIL_TO_PASS", row["FAIL_TO_PASS"])
        p2p = _test_list(iid, "PASS_TO_PASS", row["PASS_TO_PASS"])
        text = {}
        for name in TEXT_FIELDS:
            value = row.get(name)
            if value is None:
                value = ""
            if name == "version" and isinstance(value, (int, float)):
                value = str(value)
            if not isinstance(value, str):
                raise TaskError(iid, name, f"must be a string, got {type(value).__name__}")
            text[name] = value
        grading = {}
        for name in GRADING_FIELDS:
            value = row.get(name)
            if value in ("", None):
                value = None
            elif not isinstance(value, str):
                raise TaskError(iid, name, f"must be a string, got {type(value).__name__}")
            grading[name] = value
        if grading["log_parser"] is not None:
            known = parser_registry()
            if grading["log_parser"] not in known:
                raise TaskError(iid, "log_parser", f"unknown log parser {grading['log_parser']!r}: not in swebench's "
                                f"PARSER_REGISTRY (known: {', '.join(sorted(known))})")
        if grading["eval_type"] is not None and grading["eval_type"] not in EVAL_TYPES:
            raise TaskError(iid, "eval_type", f"{grading['eval_type']!r} is not one of {', '.join(EVAL_TYPES)}")
        if grading["eval_script"] is not None:
            # lazy: swebench is heavy
            from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT

            for marker in (START_TEST_OUTPUT, END_TEST_OUTPUT):
                if marker not in grading["eval_script"]:
                    raise TaskError(iid, "eval_script", f"has no {marker!r} marker, so its output cannot be graded")
        for name in ("patch", "test_patch"):
            if text[name] and "diff --git" not in text[name] and "\n+++ " not in text[name]:
                raise TaskError(iid, name, "does not look like a unified diff")
        difficulty = row.get("difficulty")
        setup = row.get("episode_setup")
        if setup is not None and not isinstance(setup, str):
            raise TaskError(iid, "episode_setup", f"must be a string, got {type(setup).__name__}")
        extra = {k: v for k, v in row.items() if k not in KNOWN}
        return cls(instance_id=iid, repo=row["repo"], base_commit=row["base_commit"],
                   problem_statement=row["problem_statement"], FAIL_TO_PASS=f2p, PASS_TO_PASS=p2p, **text,
                   **grading, difficulty=None if difficulty is None else str(difficulty),
                   split=row.get("split"), episode_setup=setup or None, extra=extra, notes=list(notes or []))

    # --- what this task can be used for ----------------------------------------------------
    def why(self, name: str) -> str:
        """The adapter's note on field ``name`` ("" when it left none)."""
        return next((n.split(": ", 1)[1] for n in self.notes if n.startswith(f"{name}: ")), "")

    def missing_fields(self) -> list[str]:
        """The grading fields this task lacks (FAIL_TO_PASS counts when empty)."""
        missing = [name for name in GRADING_FIELDS if getattr(self, name) is None]
        return missing + ([] if self.FAIL_TO_PASS else ["FAIL_TO_PASS"])

    def grading_gaps(self) -> list[str]:
        """Why this task cannot be graded here, one entry per missing field (empty list = gradable)."""
        gaps = []
        for name in self.missing_fields():
            what = "no FAIL_TO_PASS tests, so nothing decides resolution" if name == "FAIL_TO_PASS" else f"no {name}"
            gaps.append(what + (f" ({self.why(name)})" if self.why(name) else ""))
        return gaps

    @property
    def gradable(self) -> bool:
        return not self.grading_gaps()

    def grading_error(self) -> TaskError | None:
        """``task ID: field 'NAME': not gradable here: ...`` (None when gradable)."""
        missing = self.missing_fields()
        if not missing:
            return None
        return TaskError(self.instance_id, missing[0], "not gradable here: " + "; ".join(self.grading_gaps()))

    def require_gradable(self) -> None:
        """Raise ``grading_error()`` unless gradable."""
        error = self.grading_error()
        if error is not None:
            raise error

    # --- swebench views ----------------------------------------------------------------------
    def to_row(self) -> dict[str, Any]:
        """The row as swebench 5.x expects it (lists for the test columns)."""
        row = dict(self.extra)
        row.update(instance_id=self.instance_id, repo=self.repo, base_commit=self.base_commit,
                   patch=self.patch, test_patch=self.test_patch, problem_statement=self.problem_statement,
                   hints_text=self.hints_text, version=self.version, FAIL_TO_PASS=list(self.FAIL_TO_PASS),
                   PASS_TO_PASS=list(self.PASS_TO_PASS))
        for name in GRADING_FIELDS + ("difficulty", "split", "episode_setup"):
            if getattr(self, name) is not None:
                row[name] = getattr(self, name)
        return row

    def test_spec(self):
        """swebench's TestSpec for this task (raises TaskError when not gradable)."""
        self.require_gradable()
        from swebench.harness.utils import make_test_spec  # lazy: swebench is heavy

        return make_test_spec(self.to_row())
