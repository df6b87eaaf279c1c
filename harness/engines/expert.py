"""``expert`` engine: the task's gold patch as minimal edits, served like a model (``engine.kind: expert``).

Each ``generate`` finds the task by its problem statement in the prompt and the turn by the replies it has
already given there (verbatim ids; ``harness.engines.scripted_policy``), and answers with that turn's reply of
``harness.expert.expert_replies``: one ``file_editor`` ``str_replace`` per changed region of the gold patch
with the shortest unique ``old_str``, then ``finish``, written in the tool-call format in force
(``tool_format``: the proxy's tool parser, or ``prompt`` with ``proxy.tool_format: prompt``) and ended by the
stop token the model's family samples there; token ids, logprob 0, the engine's version. A prompt of no
known task, or a turn past ``finish``, is an ``EngineError`` that says so. A task is planned once, on its
first request, outside the engine lock (planning reads the patched files from the task's image). Expert
episodes go through the same proxy, SDK, sandbox and grader as a model's: their traces are SFT data for any
task source with gold patches, in any chat-template family the proxy serves.
"""
from __future__ import annotations

from sao_harness.harness.engines.protocol import EngineError
from sao_harness.harness.engines.scripted_policy import ScriptedPolicyEngine
from sao_harness.harness.expert import expert_replies, image_file_reader
from sao_harness.harness.tiny_model import resolve_model_path
from sao_harness.tasks.formats.loaders import tasks_from_config


def tool_format_in_force(tokenizer, proxy_cfg) -> str | None:
    """The format the proxy reads calls in: ``prompt`` (``proxy.tool_format: prompt``), else its tool parser
    (``proxy.tool_parser``, else the one the chat template teaches; None: none)."""
    if proxy_cfg.tool_format == "prompt":
        return "prompt"
    from sao_harness.harness.proxy.parsers import parsers_from_config  # lazy: next to the proxy
    from sao_harness.harness.proxy.template import template_from_config

    return parsers_from_config(template_from_config(tokenizer, proxy_cfg), proxy_cfg)[0]


class ExpertEngine(ScriptedPolicyEngine):
    """``ScriptedPolicyEngine`` whose per-task replies are planned lazily from ``tasks``' gold patches.

    ``read_file(image, path) -> str | None`` gives the task image's files (``harness.expert.image_file_reader``);
    None: the scripted gold policy's hunk-wide edits. ``tool_format``: see ``ScriptedPolicyEngine``."""

    kind = "expert"

    @classmethod
    def from_config(cls, cfg, **kwargs) -> ExpertEngine:
        """Reads model.path, engine.timeout_s and the tool-call format in force (proxy.*); ``tasks=`` defaults
        to the config's tasks and ``read_file=`` to the task images' files (``image_file_reader``, ``cfg.docker``)."""
        from transformers import AutoTokenizer  # lazy: transformers is heavy

        if "tasks" not in kwargs:
            kwargs["tasks"] = tasks_from_config(cfg)[0]
        kwargs.setdefault("read_file", image_file_reader(cfg.docker))
        tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(cfg.model))
        kwargs.setdefault("tool_format", tool_format_in_force(tokenizer, cfg.proxy))
        return cls(tokenizer, timeout_s=cfg.engine.timeout_s, **kwargs)

    def __init__(self, tokenizer, tasks, read_file=None, **kw):
        tasks = [t for t in tasks if t.patch]
        super().__init__(tokenizer, {}, {t.instance_id: t.problem_statement for t in tasks}, **kw)
        self.tasks = {t.instance_id: t for t in tasks}
        self.read_file = read_file

    def plan(self, task_id: str) -> list:
        """The replies of ``task_id``'s expert episode (planned on first use; a race plans it twice, harmlessly)."""
        replies = self.replies_by_task.get(task_id)
        if replies is None:
            planned = expert_replies(self.tasks[task_id], self.read_file, strips=self.tool_format == "prompt")
            replies = self.replies_by_task.setdefault(task_id, planned)
        return replies

    def generate(self, prompt_ids, sampling, timeout=None):
        task_id = self.task_of(self.tokenizer.decode(prompt_ids))
        if task_id is not None:
            self.plan(task_id)
        return super().generate(prompt_ids, sampling, timeout)

    def reply_past_end(self, task_id: str, given: int):
        raise EngineError(f"expert engine: the prompt already holds all {given} replies of {task_id}'s expert "
                          "episode, finish included; it has nothing left to say")

    def health(self):
        return {**super().health(), "tasks": len(self.tasks), "planned": len(self.replies_by_task)}
