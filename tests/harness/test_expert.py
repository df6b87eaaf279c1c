"""The expert policy (``engine.kind: expert``): minimal edits of the gold patch, and its episodes.

Unit part (no Docker): the planned edits apply the gold patch exactly (checked against ``git apply``
on each bundled task's repository), each ``old_str`` is unique where it is used, and they are much
shorter than the scripted gold policy's. Docker part: expert episodes through the proxy, the SDK, the
sandbox and the grader resolve, with the compact profile are short, and their traces hold exactly the
ids the engine emitted.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from unidiff import PatchSet

from sao_harness.harness.engines.scripted_policy import gold_replies
from sao_harness.harness.expert import expert_replies, minimal_edits
from sao_harness.harness.proxy.parsers import write_hermes
from sao_harness.harness.trace import Status
from sao_harness.tasks.formats.loaders import load_tasks

TASKS = ["sao-harness__minicfg-8", "sao-harness__spanlib-8", "sao-harness__tablefmt-9"]


def _calls(replies):
    return [{"name": n, "arguments": a} for r in replies for n, a in r.calls]


def _apply(files: dict, read, call: dict, strips: bool = False) -> None:
    """The SDK editor's str_replace / create on an in-memory copy (old_str must occur exactly once); ``strips``:
    every value stripped first, as the SDK reads the prompt tool format."""
    a = {k: v.strip() if strips and isinstance(v, str) else v for k, v in call["arguments"].items()}
    if a["command"] == "create":
        files[a["path"]] = a["file_text"]
        return
    text = files.get(a["path"]) or read(None, a["path"])
    start = text.find(a["old_str"])
    assert start >= 0 and text.find(a["old_str"], start + 1) == -1, a["old_str"]
    files[a["path"]] = text.replace(a["old_str"], a["new_str"] or "")


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _action_tokens(tokenizer, replies) -> int:
    return sum(len(tokenizer.encode(write_hermes(r.content, r.calls), add_special_tokens=False)) + 1
               for r in replies)  # + EOS, as emitted


def test_minimal_edits_grow_context_only_until_unique():
    text = "a\nx = 1\nb\nx = 1\nc\n"
    diff = "--- a/f.py\n+++ b/f.py\n@@ -3,3 +3,3 @@\n b\n-x = 1\n+x = 2\n c\n"
    [pf] = PatchSet(diff)
    assert minimal_edits(text, pf) == [("x = 1\nc", "x = 2\nc")]  # `x = 1` twice: one line after makes it unique
    diff = "--- a/f.py\n+++ b/f.py\n@@ -1,2 +1,3 @@\n a\n+new\n x = 1\n"
    [pf] = PatchSet(diff)
    assert minimal_edits(text, pf) == [("a", "a\nnew")]  # a pure insertion anchors on a neighbouring line
    assert minimal_edits("something else\n", pf) is None  # the diff does not match: the caller falls back


def test_minimal_edits_survive_the_prompt_formats_stripping():
    """The SDK strips every value of a prompt-format call: an edit whose old and new ends differ in whitespace
    grows context until the stripped edit does the same (at the file's start it cannot: None, the caller falls
    back)."""
    text = "x = 0\ndef f():\n    return 1\n"
    diff = "--- a/f.py\n+++ b/f.py\n@@ -1,3 +1,4 @@\n x = 0\n-def f():\n+    # f\n+def f():\n     return 1\n"
    [pf] = PatchSet(diff)
    assert minimal_edits(text, pf) == [("def f():", "    # f\ndef f():")]  # stripped, the comment loses its indent
    assert minimal_edits(text, pf, strips=True) == [("x = 0\ndef f():", "x = 0\n    # f\ndef f():")]
    [pf] = PatchSet(diff.replace("@@ -1,3 +1,4 @@\n x = 0\n", "@@ -1,2 +1,3 @@\n"))
    assert minimal_edits(text.removeprefix("x = 0\n"), pf, strips=True) is None
    diff = "--- a/f.py\n+++ b/f.py\n@@ -2,2 +2,3 @@\n def f():\n+    y = 2\n     return 1\n"
    [pf] = PatchSet(diff)
    assert minimal_edits(text, pf, strips=True) == minimal_edits(text, pf) == [("def f():", "def f():\n    y = 2")]


def test_expert_edits_apply_each_bundled_gold_patch_and_are_short(tmp_path, tokenizer):
    """Also planned for the prompt tool format (``strips``): the stripped values apply the patch as well."""
    expert = gold = 0
    for task in load_tasks("bundled"):
        repo = tmp_path / task.instance_id
        bundle = Path("tasks/bundled/tasks") / task.instance_id / "repo.bundle"
        subprocess.run(["git", "clone", "-q", str(bundle), str(repo)], check=True,
                       cwd=Path(__file__).resolve().parents[2])
        subprocess.run(["git", "-C", str(repo), "checkout", "-q", task.base_commit], check=True)

        def read(image, path, repo=repo):
            p = repo / path.removeprefix("/testbed/")
            return p.read_text() if p.is_file() else None

        replies = expert_replies(task, read)
        applied = []
        for strips in (False, True):
            files: dict[str, str] = {}
            calls = _calls(expert_replies(task, read, strips=strips))
            assert calls[-1]["name"] == "finish" and all(c["name"] == "file_editor" for c in calls[:-1])
            for call in calls[:-1]:
                _apply(files, read, call, strips)
            applied.append(files)
        subprocess.run(["git", "-C", str(repo), "apply", "-"], input=task.patch.encode(), check=True)
        for files in applied:
            for path, text in files.items():
                assert read(None, path) == text, (task.instance_id, path)
        expert += _action_tokens(tokenizer, replies)
        gold += _action_tokens(tokenizer, gold_replies(task))
        assert _calls(expert_replies(task, None))[:-1] == _calls(gold_replies(task))[1:-1]  # unreadable: hunks
    assert expert < 0.7 * gold, (expert, gold)


@pytest.mark.docker
def test_expert_episodes_resolve_are_short_and_traces_hold_the_emitted_ids(docker_engine, project_root,
                                                                           tmp_path, tokenizer):
    from sao_harness.harness.engines import make_engine
    from sao_harness.harness.engines.expert import ExpertEngine
    from sao_harness.harness.expert import image_file_reader
    from sao_harness.harness.proxy import ProxyServer
    from sao_harness.harness.rollout import run_rollout
    from sao_harness.harness.store import TraceStore
    from sao_harness.sao.config import load_config

    class Recording(ExpertEngine):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.emitted: dict[str, list[list[int]]] = {}

        def generate(self, prompt_ids, sampling, timeout=None):
            result = super().generate(prompt_ids, sampling, timeout)
            task_id = self.task_of(self.tokenizer.decode(prompt_ids))
            self.emitted.setdefault(task_id, []).append(list(result.token_ids))
            return result

    def run(profile, ids):
        cfg = load_config(project_root / "configs/local.yaml", [
            f"run.root={tmp_path}", f"run.name={profile}", "engine.kind=expert", f"agent.profile={profile}",
            f"tasks.instances=[{', '.join(ids)}]", "rollout.workers=2", "sampling.max_tokens=4096",
            "agent.stuck_detection=false", f"model.cache_dir={project_root / '.cache/sao'}"])
        assert isinstance(make_engine(cfg), ExpertEngine)
        tasks = load_tasks("bundled", instances=ids)
        engine = Recording(tokenizer, tasks, read_file=image_file_reader(cfg.docker))
        proxy = ProxyServer(engine, tokenizer, cfg)
        proxy.start(port=0)
        try:
            stats = run_rollout(cfg, tasks, engine=engine, proxy=proxy, log=lambda *_: None)
        finally:
            proxy.stop()
        assert stats.done == len(ids) and stats.resolved == len(ids)
        return {t.task_id: t for t in TraceStore(cfg.run.dir)}, engine, tasks

    trajs, engine, tasks = run("compact", TASKS)
    for task in tasks:
        traj = trajs[task.instance_id]
        assert traj.status == Status.OK and traj.reward == 1.0 and traj.breaks == []
        actions = [s.token_ids for s in traj.segments if s.kind == "action"]
        assert actions == engine.emitted[task.instance_id]  # exactly the ids the engine emitted, turn by turn
        gold = _action_tokens(tokenizer, gold_replies(task))
        assert traj.num_action_tokens < 0.6 * gold, (traj.num_action_tokens, gold)
        assert traj.num_tokens <= 3000, traj.num_tokens  # the compact profile: a short episode
    full, _, _ = run("openhands", TASKS[:1])
    assert full[TASKS[0]].num_tokens > 3 * trajs[TASKS[0]].num_tokens  # the SDK's own prompt, unchanged


def test_compact_profile_keeps_the_tools_parameters():
    """Compact tool texts only: every parameter keeps its name, type, default and required-ness."""
    from openhands.sdk.tool.builtins import FinishAction, ThinkAction
    from openhands.tools.file_editor.definition import FileEditorAction
    from openhands.tools.terminal.definition import TerminalAction

    from sao_harness.harness.tools.registry import COMPACT_TOOLS

    def shape(action_type):
        schema = action_type.to_mcp_schema()
        props = {k: {f: v for f, v in p.items() if f != "description"} for k, p in schema["properties"].items()
                 if k != "summary"}  # summary: the SDK adds it to every tool; compact declares it with a short text
        return props, sorted(schema.get("required", []))

    sdk = {"terminal": TerminalAction, "file_editor": FileEditorAction, "finish": FinishAction, "think": ThinkAction}
    for name, (description, action_type) in COMPACT_TOOLS.items():
        assert issubclass(action_type, sdk[name]) and len(description) < 200
        assert shape(action_type) == shape(sdk[name]), name
