"""A scripted policy for end-to-end tests — a TEST DOUBLE, not a model.

It proves the path to ``resolved``: for each task it emits, through the same proxy and the same
OpenHands tools as a real model, the gold patch as ``file_editor`` calls (one ``str_replace`` per
hunk, ``create`` for new files), then ``finish``. A reply is a ``Reply`` (calls and content), written in
the tool-call format in force (``tool_format``: a ``harness.proxy.parsers.TOOL_WRITERS`` name, or
``prompt``), or a text given as is; ``ScriptedEngine`` turns it into tokens (logprob 0, the engine's
version) and ends it with the stop token the template's next turn starts with (GLM: ``<|observation|>``
after a call, ``<|user|>`` otherwise; the EOS for the others).

It is stateless per episode and safe under concurrency: each ``generate`` finds the task by its
problem statement in the prompt, and the turn by the replies it has already given in this conversation.
The proxy keeps a reply's token ids verbatim in every later prompt of the episode (``harness.proxy.session``),
so turn t is the number of the task's replies found in the prompt, in order, each as exactly the ids this
engine emits for it (cut at the request's stop strings: a client sends the same ones every turn, as the SDK
does). Unlike counting a template's assistant header, this
holds for every chat template and cannot be fooled by a header's text in a tool's output (the proxy encodes
observations with special tokens); a history the proxy re-rendered (a sequence break) holds no verbatim
reply, and the policy then starts over from the first reply it does not find.
"""
from __future__ import annotations

from typing import NamedTuple

from unidiff import PatchSet

from sao_harness.harness.engines.protocol import EngineError
from sao_harness.harness.engines.scripted import ScriptedEngine
from sao_harness.harness.proxy.parsers import TOOL_PARSERS, TOOL_WRITERS, default_parsers, prompt_calls, write_hermes

REPO = "/testbed"


class Reply(NamedTuple):
    """One assistant turn: ``content`` (may be None), then ``calls`` [(tool name, arguments)]."""

    calls: list[tuple[str, dict]]
    content: str | None = None


def call(name: str, arguments: dict) -> Reply:
    """A reply that is one tool call."""
    return Reply([(name, arguments)])


def tool_call(name: str, arguments: dict) -> str:
    """One call as Hermes ``<tool_call>`` text (a reply given as is)."""
    return write_hermes(None, [(name, arguments)])


def patch_to_tool_calls(patch: str, repo: str = REPO) -> list[Reply]:
    """The ``file_editor`` calls that apply ``patch``: str_replace of each hunk's old lines by its new lines."""
    calls = []
    for pf in PatchSet(patch):
        path = f"{repo}/{pf.path}"
        if pf.is_added_file:
            text = "".join(line.value for hunk in pf for line in hunk if line.is_added)
            calls.append(call("file_editor", {"command": "create", "path": path, "file_text": text}))
        elif pf.is_removed_file:
            calls.append(call("terminal", {"command": f"rm {path}"}))
        else:
            for hunk in pf:
                old = "".join(line.value for line in hunk if not line.is_added)
                new = "".join(line.value for line in hunk if not line.is_removed)
                calls.append(call("file_editor", {"command": "str_replace", "path": path,
                                                  "old_str": old, "new_str": new}))
    return calls


def gold_replies(task) -> list[Reply]:
    """Look at the repository, apply the gold patch with the file editor, then finish."""
    return ([Reply([("terminal", {"command": f"cd {REPO} && git status"})], "I will look at the repository first.")]
            + patch_to_tool_calls(task.patch)
            + [call("finish", {"message": "I applied the fix."})])


def tool_format_of(tokenizer) -> str:
    """The tool-call format a model with ``tokenizer`` writes by default: the parser its chat template
    teaches (``default_parsers``), else ``prompt`` (the only format the proxy serves with such a template)."""
    template = getattr(tokenizer, "chat_template", None)
    return (default_parsers(template)[0] if isinstance(template, str) else None) or "prompt"


def _find(ids: list[int], sub: list[int], start: int) -> int:
    """The first index >= ``start`` where ``sub`` occurs in ``ids`` (-1 if none)."""
    if not sub:
        return start
    first, n = sub[0], len(sub)
    for i in range(start, len(ids) - n + 1):
        if ids[i] == first and ids[i:i + n] == sub:
            return i
    return -1


class ScriptedPolicyEngine(ScriptedEngine):
    """``ScriptedEngine`` whose reply depends on the prompt: per task (found by its problem statement),
    the ``replies[task_id][turn]`` list (``Reply`` or text); past its end, ``finish`` (``reply_past_end``).
    ``tool_format``: how ``Reply`` calls are written (a ``TOOL_WRITERS`` name or ``prompt``); None: the
    format of the tokenizer's chat template (``tool_format_of``). A prompt of no known task is an ``EngineError``."""

    kind = "scripted"

    def __init__(self, tokenizer, replies_by_task: dict[str, list[Reply | str]], problem_statements: dict[str, str],
                 tool_format: str | None = None, **kw):
        super().__init__(tokenizer, **kw)
        self.tool_format = tool_format or tool_format_of(self.tokenizer)
        if self.tool_format != "prompt" and self.tool_format not in TOOL_WRITERS:
            raise ValueError(f"tool_format: unknown format {self.tool_format!r}; known: "
                             f"{', '.join(sorted(TOOL_WRITERS))}, prompt")
        self.replies_by_task = replies_by_task
        # a distinctive slice of each problem statement identifies the task in the rendered prompt
        self.keys = {tid: ps.strip()[:200] for tid, ps in problem_statements.items()}
        self.turn_ends = self._turn_ends()

    @classmethod
    def gold(cls, tokenizer, tasks, **kw) -> ScriptedPolicyEngine:
        return cls(tokenizer, {t.instance_id: gold_replies(t) for t in tasks},
                   {t.instance_id: t.problem_statement for t in tasks}, **kw)

    def _turn_ends(self) -> dict[bool, int]:
        """The stop token that ends a reply with calls (True) and without (False): the first token of what
        the template puts after such a turn (a tool result's turn; a user's) when it is a stop token, else EOS."""
        eos = self.tokenizer.eos_token_id
        if not isinstance(getattr(self.tokenizer, "chat_template", None), str):
            return {True: eos, False: eos}
        from sao_harness.harness.proxy.template import ChatTemplate  # lazy: next to the proxy

        tpl = ChatTemplate(self.tokenizer)
        after = {True: tpl.after_reply(None, [{"role": "tool", "tool_call_id": "c1", "content": "."}], None, [],
                                       [("c1", "terminal")]),
                 False: tpl.after_reply(None, [{"role": "user", "content": "."}], None, [])}
        firsts = {k: tpl.encode(text)[:1] for k, text in after.items()}
        return {k: first[0] if first and first[0] in tpl.eos_ids else eos for k, first in firsts.items()}

    def write(self, reply: Reply | str) -> str:
        """The text of ``reply`` in the tool-call format in force (a text reply as is)."""
        if isinstance(reply, str):
            return reply
        writer = prompt_calls if self.tool_format == "prompt" else TOOL_WRITERS[self.tool_format]
        try:
            return writer(reply.content, reply.calls)
        except ValueError as e:
            raise EngineError(f"{self.kind} engine: cannot write {[n for n, _ in reply.calls]} in the "
                              f"{self.tool_format} tool-call format: {e}") from None

    def end_of_turn(self, text: str) -> int:
        calls = self.tool_format != "prompt" and TOOL_PARSERS[self.tool_format](text, None)[1] is not None
        return self.turn_ends[bool(calls)]  # prompt format: every turn is text, a user turn follows

    def task_of(self, text: str) -> str | None:
        """The task whose problem statement is in the rendered prompt ``text``."""
        return next((tid for tid, key in self.keys.items() if key and key in text), None)

    def turn_of(self, prompt_ids: list[int], replies: list[Reply | str]) -> int:
        """How many of ``replies`` the prompt holds, in order, as the ids this engine emits for them (module doc)."""
        at = 0
        for turn, reply in enumerate(replies):
            text, _ = self.cut_at_stop(self.write(reply), self.sampling.stop)
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            found = _find(prompt_ids, ids, at)
            if found < 0:
                return turn
            at = found + len(ids)
        return len(replies)

    def reply_past_end(self, task_id: str, given: int) -> Reply | str:
        """The reply once all ``given`` replies of ``task_id`` are in the prompt: ``finish``."""
        return call("finish", {"message": "done"})

    def next_reply(self, prompt_ids: list[int]) -> str:
        task_id = self.task_of(self.tokenizer.decode(prompt_ids))
        if task_id is None:
            raise EngineError(f"{self.kind} engine: the prompt holds the problem statement of none of its "
                              f"{len(self.keys)} tasks, so it cannot tell which task to act on")
        replies = self.replies_by_task[task_id]
        turn = self.turn_of(prompt_ids, replies)
        return self.write(replies[turn] if turn < len(replies) else self.reply_past_end(task_id, turn))
