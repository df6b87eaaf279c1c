"""``expert`` engine: the task's gold patch as minimal edits, served like a model (``engine.kind: expert``).

Each ``generate`` finds the task by its problem statement in the prompt and the turn by the assistant
turns already in it, and answers with that turn's reply of ``harness.expert.expert_replies``: one
``file_editor`` ``str_replace`` per changed region of the gold patch with the shortest unique
``old_str``, then ``finish`` (Hermes ``<tool_call>`` text as token ids, logprob 0, the engine's
version). A task is planned once, on its first request, outside the engine lock (planning reads the
patched files from the task's image). Expert episodes go through the same proxy, SDK, sandbox and
grader as a model's: their traces are SFT data for any task source with gold patches.
"""
from __future__ import annotations

from sao_harness.harness.engines.scripted_policy import ScriptedPolicyEngine
from sao_harness.harness.expert import expert_replies, image_file_reader
from sao_harness.harness.tiny_model import resolve_model_path
from sao_harness.tasks.loaders import tasks_from_config


class ExpertEngine(ScriptedPolicyEngine):
    """``ScriptedPolicyEngine`` whose per-task replies are planned lazily from ``tasks``' gold patches.

    ``read_file(image, path) -> str | None`` gives the task image's files (``harness.expert.image_file_reader``);
    None: the scripted gold policy's hunk-wide edits."""

    kind = "expert"

    @classmethod
    def from_config(cls, cfg, **kwargs) -> ExpertEngine:
        """Reads model.path and engine.timeout_s; ``tasks=`` defaults to the config's tasks and ``read_file=``
        to the task images' files (``harness.expert.image_file_reader`` over ``cfg.docker``)."""
        if "tasks" not in kwargs:
            kwargs["tasks"] = tasks_from_config(cfg)[0]
        kwargs.setdefault("read_file", image_file_reader(cfg.docker))
        return cls(resolve_model_path(cfg.model), timeout_s=cfg.engine.timeout_s, **kwargs)

    def __init__(self, tokenizer, tasks, read_file=None, **kw):
        tasks = [t for t in tasks if t.patch]
        super().__init__(tokenizer, {}, {t.instance_id: t.problem_statement for t in tasks}, **kw)
        self.tasks = {t.instance_id: t for t in tasks}
        self.read_file = read_file

    def plan(self, task_id: str) -> list[str]:
        """The replies of ``task_id``'s expert episode (planned on first use; a race plans it twice, harmlessly)."""
        replies = self.replies_by_task.get(task_id)
        if replies is None:
            replies = self.replies_by_task.setdefault(task_id, expert_replies(self.tasks[task_id], self.read_file))
        return replies

    def generate(self, prompt_ids, sampling, timeout=None):
        task_id = self.task_of(self.tokenizer.decode(prompt_ids))
        if task_id is not None:
            self.plan(task_id)
        return super().generate(prompt_ids, sampling, timeout)

    def health(self):
        return {**super().health(), "tasks": len(self.tasks), "planned": len(self.replies_by_task)}
