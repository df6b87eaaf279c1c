"""A scripted policy for end-to-end tests — a TEST DOUBLE, not a model.

It proves the path to ``resolved``: for each task it emits, through the same proxy and the same
OpenHands tools as a real model, the gold patch as ``file_editor`` calls (one ``str_replace`` per
hunk, ``create`` for new files), then ``finish``. Replies are Hermes ``<tool_call>`` text, turned
into tokens by ``ScriptedEngine`` (logprob 0, the engine's version).

It is stateless per episode and safe under concurrency: each ``generate`` finds the task by its
problem statement in the prompt and the turn by the number of assistant turns already in it.
"""
from __future__ import annotations

import json

from unidiff import PatchSet

from sao_harness.harness.engines.scripted import ScriptedEngine

REPO = "/testbed"


def tool_call(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def patch_to_tool_calls(patch: str, repo: str = REPO) -> list[str]:
    """The ``file_editor`` calls that apply ``patch``: str_replace of each hunk's old lines by its new lines."""
    calls = []
    for pf in PatchSet(patch):
        path = f"{repo}/{pf.path}"
        if pf.is_added_file:
            text = "".join(line.value for hunk in pf for line in hunk if line.is_added)
            calls.append(tool_call("file_editor", {"command": "create", "path": path, "file_text": text}))
        elif pf.is_removed_file:
            calls.append(tool_call("terminal", {"command": f"rm {path}"}))
        else:
            for hunk in pf:
                old = "".join(line.value for line in hunk if not line.is_added)
                new = "".join(line.value for line in hunk if not line.is_removed)
                calls.append(tool_call("file_editor", {"command": "str_replace", "path": path,
                                                       "old_str": old, "new_str": new}))
    return calls


def gold_replies(task) -> list[str]:
    """Look at the repository, apply the gold patch with the file editor, then finish."""
    return ([f"I will look at the repository first.\n{tool_call('terminal', {'command': f'cd {REPO} && git status'})}"]
            + patch_to_tool_calls(task.patch)
            + [tool_call("finish", {"message": "I applied the fix."})])


class ScriptedPolicyEngine(ScriptedEngine):
    """``ScriptedEngine`` whose reply depends on the prompt: per task (found by its problem statement),
    the ``replies[task_id][turn]`` list; past its end, ``finish``."""

    kind = "scripted"

    def __init__(self, tokenizer, replies_by_task: dict[str, list[str]], problem_statements: dict[str, str], **kw):
        super().__init__(tokenizer, **kw)
        self.replies_by_task = replies_by_task
        # a distinctive slice of each problem statement identifies the task in the rendered prompt
        self.keys = {tid: ps.strip()[:200] for tid, ps in problem_statements.items()}

    @classmethod
    def gold(cls, tokenizer, tasks, **kw) -> ScriptedPolicyEngine:
        return cls(tokenizer, {t.instance_id: gold_replies(t) for t in tasks},
                   {t.instance_id: t.problem_statement for t in tasks}, **kw)

    def task_of(self, text: str) -> str | None:
        """The task whose problem statement is in the rendered prompt ``text``."""
        return next((tid for tid, key in self.keys.items() if key and key in text), None)

    def next_reply(self, prompt_ids: list[int]) -> str:
        text = self.tokenizer.decode(prompt_ids)
        task_id = self.task_of(text)
        if task_id is None:
            return tool_call("finish", {"message": "unknown task"})
        turn = text.count("<|im_start|>assistant") - 1  # the generation prompt is the last one
        replies = self.replies_by_task[task_id]
        return replies[turn] if 0 <= turn < len(replies) else tool_call("finish", {"message": "done"})
