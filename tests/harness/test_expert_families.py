"""The expert speaks every family: its calls in the tool-call format in force, its turns found from the
replies already in the prompt, whatever the chat template.

Unit part (no Docker): every tool parser reads back exactly what its writer writes, and the SDK reads the
prompt format's; on each published template family (``template_families.FAMILIES``) and on Llama 3's with
``proxy.tool_format: prompt``, a whole expert conversation through the proxy over HTTP: every reply is read
(by the proxy's parser, or by the SDK in the prompt format) as exactly the planned call, turn after turn, and
ends with the family's stop token; the old behaviour (Hermes calls under Llama 3) reads as no call at all. A
prompt of no task, or a turn past ``finish``, is an engine error, never a ``finish``. Docker part: expert
episodes through the SDK, the sandbox and the grader resolve bundled tasks (reward 1) with Llama 3's template
(native tools, and the prompt format) and with GLM's.
"""
from __future__ import annotations

import json

import openai
import pytest
from openhands.sdk.llm.mixins.fn_call_converter import STOP_WORDS, convert_non_fncall_messages_to_fncall_messages
from transformers import AutoTokenizer

from sao_harness.harness.engines.expert import ExpertEngine
from sao_harness.harness.engines.protocol import EngineError, SamplingParams
from sao_harness.harness.proxy import ProxyServer
from sao_harness.harness.proxy.parsers import TOOL_PARSERS, TOOL_WRITERS, prompt_calls
from sao_harness.harness.trace import Status
from sao_harness.sao.config import load_config
from sao_harness.tasks.formats.loaders import load_tasks
from tests.harness.template_families import FAMILIES
from tests.support.proxy import Spy

TASK = "sao-harness__minicfg-8"


def _tool(name: str, **props) -> dict:
    return {"type": "function", "function": {"name": name, "description": name, "parameters": {
        "type": "object", "properties": {k: {"type": t} for k, t in props.items()}, "required": []}}}


TOOLS = [_tool("file_editor", command="string", path="string", old_str="string", new_str="string",
               file_text="string", view_range="array"),
         _tool("terminal", command="string"), _tool("finish", message="string")]
CALLS = [("file_editor", {"command": "str_replace", "path": "/testbed/a.py", "old_str": '    x = {"a": [1]}\n',
                          "new_str": "\n  y = 'é' < 2 \\n\n\n"}),
         ("finish", {"message": "Done."})]


@pytest.fixture(scope="module")
def task():
    return load_tasks("bundled", instances=[TASK])[0]


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
def test_each_parser_reads_back_what_its_writer_writes(name):
    assert set(TOOL_WRITERS) == set(TOOL_PARSERS)
    write, parse = TOOL_WRITERS[name], TOOL_PARSERS[name]
    for content, calls in [(None, CALLS[:1]), ("Let me edit it.", CALLS), (None, CALLS[1:])]:
        got_content, got, attempted = parse(write(content, calls), TOOLS)
        assert attempted and [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got] == calls
        assert got_content == (None if name == "llama3_json" else content)  # a Llama 3 call is the whole reply
    assert parse(write("Just text.", []), TOOLS)[1] is None


def _sdk_call(text: str):
    """The call the OpenHands SDK reads from a prompt-format reply (None: none)."""
    msg = convert_non_fncall_messages_to_fncall_messages([{"role": "assistant", "content": text}], TOOLS)[-1]
    calls = msg.get("tool_calls") or []
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] or None


def test_the_sdk_reads_back_the_prompt_formats_calls_stripped():
    stripped = [(n, {k: v.strip() for k, v in a.items()}) for n, a in CALLS]
    for call, want in zip(CALLS, stripped):
        assert _sdk_call(prompt_calls("Let me edit it.", [call])) == [want]
        cut = prompt_calls(None, [call])[:-1]  # as emitted under the SDK's stop word "</function"
        assert cut.endswith(STOP_WORDS[0]) and _sdk_call(cut) == [want]
    with pytest.raises(ValueError, match="one call per reply"):
        prompt_calls(None, CALLS)


# (family, proxy.tool_format): every published family natively, and Llama 3's template in the prompt format
CASES = [(f, "native") for f in sorted(FAMILIES)] + [("llama3.1", "prompt")]


def _proxy(fam, proxy_tool_format, **kw):
    """A proxy over the expert engine built from the config (its tool-call format: the one in force)."""
    path = FAMILIES[fam].model_dir()
    cfg = load_config(None, [f"model.path={path}", "sampling.max_tokens=4096", f"proxy.tool_format={proxy_tool_format}",
                             "engine.kind=expert"])
    engine = Spy(ExpertEngine.from_config(cfg, tasks=load_tasks("bundled", instances=[TASK]), read_file=None, **kw))
    return engine.tokenizer, engine, ProxyServer(engine, engine.tokenizer, cfg)


def _conversation(url, task, prompt_format: bool, turns: int):
    """The client's side, as the SDK sends it: ``turns`` requests, each answered with a tool result (a user
    turn in the prompt format); the calls each reply carries, as the proxy (or the SDK) reads them."""
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120,
                           default_headers={"X-Episode-Id": "ep"})
    messages = [{"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": task.problem_statement}]
    got = []
    for turn in range(turns):
        if prompt_format:
            reply = client.chat.completions.create(model="m", messages=messages, stop=STOP_WORDS).choices[0].message
            got.append(_sdk_call(reply.content))
            messages += [{"role": "assistant", "content": reply.content},
                         {"role": "user", "content": f"EXECUTION RESULT of [file_editor]:\noutput {turn}"}]
            continue
        reply = client.chat.completions.create(model="m", messages=messages, tools=TOOLS).choices[0].message
        calls = reply.tool_calls or []
        got.append([(c.function.name, json.loads(c.function.arguments)) for c in calls] or None)
        messages += [{"role": "assistant", "content": (reply.content or "").strip(),
                      "tool_calls": [c.model_dump() for c in calls]},
                     *[{"role": "tool", "tool_call_id": c.id, "content": f"output {turn}"} for c in calls]]
        if not calls:
            messages.append({"role": "user", "content": "Please continue."})
    return client, messages, got


@pytest.mark.parametrize(("fam", "tool_format"), CASES, ids=[f"{f}-{t}" for f, t in CASES])
def test_expert_conversation_is_read_as_the_planned_calls(fam, tool_format, task):
    tok, engine, proxy = _proxy(fam, tool_format)
    plan = engine.plan(TASK)
    prompt_format = tool_format == "prompt"
    assert engine.tool_format == ("prompt" if prompt_format else FAMILIES[fam].tool_parser)
    url = proxy.start()
    try:
        client, messages, got = _conversation(url, task, prompt_format, len(plan))
        with pytest.raises(openai.APIStatusError, match="nothing left to say") as err:  # past finish
            client.chat.completions.create(model="m", messages=messages, **(
                {"stop": STOP_WORDS} if prompt_format else {"tools": TOOLS}))
        assert err.value.status_code == 503
        traj = proxy.close_episode("ep")
    finally:
        proxy.stop()
    want = [[(n, {k: v.strip() for k, v in a.items()} if prompt_format else a) for n, a in r.calls] for r in plan]
    assert got[0] is not None and got[0][0][1]["command"] == "str_replace"  # the first edit is read as a call
    assert got == want and want[-1] == [("finish", {"message": "Done."})]
    assert traj.breaks == [] and traj.turns == len(plan)
    for _, res in engine.calls[:len(plan)]:  # ended as the family ends a turn with a call (the SDK: its stop word)
        if prompt_format:
            assert res.stop_str == STOP_WORDS[0] and tok.decode(res.token_ids).endswith(STOP_WORDS[0])
        else:
            assert tok.convert_ids_to_tokens(res.token_ids[-1]) == FAMILIES[fam].stop


def test_hermes_calls_under_llama3_are_no_calls(task):
    """The old behaviour, Hermes text whatever the template: under Llama 3 the proxy reads no call at all,
    so the conversation test above fails on it."""
    _, _, proxy = _proxy("llama3.1", "native", tool_format="hermes")
    url = proxy.start()
    try:
        _, _, got = _conversation(url, task, False, 1)
    finally:
        proxy.stop()
    assert got == [None]


def test_a_prompt_without_a_known_task_is_an_engine_error(task):
    tok = AutoTokenizer.from_pretrained(FAMILIES["llama3.1"].model_dir())
    engine = ExpertEngine(tok, [task], read_file=None)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Fix some other bug."}], add_generation_prompt=True)
    with pytest.raises(EngineError, match="problem statement of none of its 1 tasks"):
        engine.generate(prompt, SamplingParams(max_tokens=4096))


@pytest.mark.docker
@pytest.mark.parametrize(("fam", "tool_format"), [("llama3.1", "native"), ("llama3.1", "prompt"), ("glm4.6", "native")],
                         ids=["llama3.1-native", "llama3.1-prompt", "glm4.6-native"])
def test_expert_episodes_resolve_in_other_families(docker_engine, project_root, tmp_path, fam, tool_format):
    """Expert episodes (compact profile, Docker sandbox, official grader) on two bundled tasks: resolved,
    reward 1, no break, no error; every action is exactly what the engine emitted, and its first one is read
    as a ``str_replace`` call (the proxy's parser; the SDK's for the prompt format)."""
    from sao_harness.harness.engines import make_engine
    from sao_harness.harness.expert import image_file_reader
    from sao_harness.harness.rollout import run_rollout
    from sao_harness.harness.store import TraceStore

    ids = [TASK, "sao-harness__tablefmt-9"]
    path = FAMILIES[fam].model_dir()
    tok = AutoTokenizer.from_pretrained(path)
    cfg = load_config(project_root / "configs/local.yaml", [
        f"run.root={tmp_path}", f"run.name={fam}-{tool_format}", "engine.kind=expert", "agent.profile=compact",
        f"tasks.instances=[{', '.join(ids)}]", "rollout.workers=2", "sampling.max_tokens=4096",
        "agent.stuck_detection=false", f"model.path={path}", f"proxy.tool_format={tool_format}"])
    made = make_engine(cfg, read_file=None)
    assert isinstance(made, ExpertEngine) and made.tool_format == (
        "prompt" if tool_format == "prompt" else FAMILIES[fam].tool_parser)
    tasks = load_tasks("bundled", instances=ids)
    engine = Spy(ExpertEngine(tok, tasks, read_file=image_file_reader(cfg.docker),
                              tool_format=made.tool_format))
    proxy = ProxyServer(engine, tok, cfg)
    proxy.start(port=0)
    try:
        stats = run_rollout(cfg, tasks, engine=engine, proxy=proxy, log=lambda *_: None)
    finally:
        proxy.stop()
    trajs = {t.task_id: t for t in TraceStore(cfg.run.dir)}
    emitted = [list(res.token_ids) for _, res in engine.calls]
    for task_id in ids:
        traj = trajs[task_id]
        assert traj.status == Status.OK and traj.reward == 1.0 and traj.breaks == [], (task_id, traj.metadata)
        assert traj.metadata["errors"] == []
        actions = [seg.token_ids for seg in traj.segments if seg.kind == "action"]
        assert all(a in emitted for a in actions) and len(actions) >= 2
        first = tok.decode(actions[0]).removesuffix(FAMILIES[fam].stop)  # the stop token the family samples
        if tool_format == "prompt":
            calls = _sdk_call(first)
        else:
            calls = TOOL_PARSERS[FAMILIES[fam].tool_parser](first, TOOLS)[1]
            calls = calls and [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
        assert calls and calls[0][0] == "file_editor" and calls[0][1]["command"] == "str_replace", first
    assert stats.done == len(ids) and stats.resolved == len(ids)
