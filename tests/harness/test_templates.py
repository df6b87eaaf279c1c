"""The published chat templates of the families people train (fixtures/templates/), each in a 6-turn
tool-calling episode through the proxy over HTTP: two tool calls answered by two consecutive tool
results, a plain reply answered by a user nudge, reasoning where the family thinks.

Per turn, against the template itself (``tokenizer.apply_chat_template`` on the conversation with each
reply as the text the model wrote, independent of the proxy's own rendering):
- the engine's prompt is exactly the trace so far (every earlier observation and action) plus the new
  observation, with no break;
- that observation is exactly how the template ends its full render of the conversation: the turn end,
  the new messages grouped as the template groups them, the generation prompt; and where the template
  keeps every earlier turn as written (before a user query moves Qwen3's / GLM's reasoning cut-off) the
  whole prompt equals the full render;
- the model's calls come back as OpenAI ``tool_calls`` and its reasoning as ``reasoning_content``.
With the ``hf`` engine (the tiny model sampling), the trainer's logprobs recomputed from the stored trace
equal the engine's (fp32, max error <= 1e-3).
"""
import json
import signal

import httpx
import pytest
import torch
from openai import OpenAI
from transformers import AutoModelForCausalLM, AutoTokenizer

from sao_harness.harness.engines import make_engine
from sao_harness.harness.engines.scripted import ScriptedEngine
from sao_harness.harness.proxy import ProxyServer, TemplateError
from sao_harness.harness.proxy.template import ChatTemplate
from sao_harness.harness.store import TraceStore, read_shard
from sao_harness.harness.trace import Status
from sao_harness.sao.config import load_config
from sao_harness.trainer.algo.batch import build_batch
from sao_harness.trainer.modeling.models import policy_token_logprobs
from tests.harness.template_families import FAMILIES, TEMPLATES
from tests.support.proxy import Spy, start_sao_serve

TOOLS = [
    {"type": "function", "function": {"name": "terminal", "description": "Run a bash command.", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
    {"type": "function", "function": {"name": "file_editor", "description": "View a file.", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}, "view_range": {"type": "array",
                                                                                   "items": {"type": "integer"}}},
        "required": ["path"]}}},
    {"type": "function", "function": {"name": "finish", "description": "End the task.", "parameters": {
        "type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}}},
]
SYSTEM = {"role": "system", "content": "You are a coding agent. Fix the bug."}
USER = {"role": "user", "content": "The test test_sum fails. Fix it."}
# (reasoning, content, calls, what the client sends next: "tools" = one result per call, "nudge" = a user turn)
SCRIPT = [
    ("Look at the repository first.", "", [("terminal", {"command": "ls"})], "tools"),
    ("Read both files.", "Reading the code.", [("terminal", {"command": "cat sum.py"}),
                                               ("file_editor", {"path": "test_sum.py", "view_range": [1, 5]})],
     "tools"),
    ("The sign is wrong; run the tests.", "", [("terminal", {"command": "python -m pytest -q"})], "tools"),
    ("It passes.", "I think the bug is fixed.", [], "nudge"),
    ("Check the diff before finishing.", "", [("terminal", {"command": "git diff"})], "tools"),
    ("Done.", "", [("finish", {"message": "Fixed the sign in sum()."})], None),
]
NUDGE = "Please continue working on the task. If you think you are done, call finish."


def client(url, episode):
    return OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120, default_headers={"X-Episode-Id": episode})


def resent(message) -> dict:
    """The reply as a client resends it (content stripped, reasoning dropped, as the OpenHands SDK does)."""
    m = message.model_dump(exclude_none=True)
    m.pop("reasoning_content", None)
    m["content"] = (m.get("content") or "").strip()
    return m


def follow_ups(kind, reply, turn) -> list[dict]:
    if kind == "tools":
        ids = [c.id for c in reply.tool_calls or []] or ["call_x1", "call_x2"]
        return [{"role": "tool", "tool_call_id": i, "content": f"output {turn}.{k}"} for k, i in enumerate(ids)]
    return [{"role": "user", "content": NUDGE}] if kind == "nudge" else []


def run_episode(url, episode):
    """The client's side of the episode (the SCRIPT's follow-ups after each reply): the replies."""
    c, messages, replies = client(url, episode), [SYSTEM, USER], []
    for turn, (*_, kind) in enumerate(SCRIPT):
        reply = c.chat.completions.create(model="m", messages=messages, tools=TOOLS).choices[0].message
        replies.append(reply)
        messages += [resent(reply), *follow_ups(kind, reply, turn)]
    return replies


def check_token_invariant(spy, traj):
    """prompt_t = obs_1 + act_1 + ... + obs_t, exactly the stored trace, and no break."""
    assert traj.breaks == [] and traj.status == Status.OK and traj.turns == len(spy.calls)
    segs = traj.segments
    for t, (prompt, res) in enumerate(spy.calls):
        assert prompt == [i for s in segs[:2 * t + 1] for i in s.token_ids], f"turn {t + 1}: prompt is not the trace"
        assert segs[2 * t + 1].token_ids == list(res.token_ids)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    fam = FAMILIES[request.param]
    path = fam.model_dir()
    return fam, path, AutoTokenizer.from_pretrained(path)


def test_template_episode_is_token_exact(family, tmp_path):
    fam, path, tok = family
    texts = [fam.reply(r, c, calls) for r, c, calls, _ in SCRIPT]
    engine = Spy(ScriptedEngine(tok, texts, eos=False))
    cfg = load_config(None, ["sampling.max_tokens=512", f"model.path={path}"])
    proxy = ProxyServer(engine, tok, cfg, store=TraceStore(tmp_path))
    assert (proxy.tool_parser, proxy.reasoning_parser) == (fam.tool_parser, fam.reasoning_parser)
    url = proxy.start()
    try:
        replies = run_episode(url, "ep")
        traj, _ = proxy.close_and_store("ep")
    finally:
        proxy.stop()
    check_token_invariant(engine, traj)

    nudged = False
    for t, ((reasoning, content, calls, kind), reply) in enumerate(zip(SCRIPT, replies)):
        # the calls and the reasoning, as OpenAI fields
        got = [(c.function.name, json.loads(c.function.arguments)) for c in reply.tool_calls or []]
        assert got == calls, f"turn {t + 1}: tool calls {got}"
        assert (reply.content or "").strip() == fam.content(content, calls)
        if fam.reasoning_parser:
            assert reply.model_extra.get("reasoning_content") == reasoning
        # the observation, against the template's own full render of the conversation
        history = [SYSTEM, USER]
        for k, ((*_, follow), rep, txt) in enumerate(zip(SCRIPT[:t], replies, texts)):
            written = txt.removesuffix(fam.stop).removesuffix(fam.stop_to_user or fam.stop)
            history += [{"role": "assistant", "content": written}, *follow_ups(follow, rep, k)]
        full = tok.apply_chat_template(history, tools=TOOLS, tokenize=False, add_generation_prompt=True)
        prompt, _ = engine.calls[t]
        if t:
            prev_prompt, prev_res = engine.calls[t - 1]
            observation = tok.decode(prompt[len(prev_prompt) + len(prev_res.token_ids):], skip_special_tokens=False)
            assert full.endswith(observation), f"turn {t + 1}: {observation!r} is not how the template ends {full!r}"
        if not (nudged and fam.strips_reasoning):
            assert tok.decode(prompt, skip_special_tokens=False) == full, f"turn {t + 1}: prompt != full render"
        nudged = nudged or kind == "nudge"
    stored = read_shard(next(tmp_path.rglob("*.parquet")))[0]
    assert stored.token_ids == traj.token_ids


def test_template_episode_logprobs_match_trainer(family):
    """The hf engine samples the tiny model; the trainer's code recomputes every action token's logprob."""
    fam, path, tok = family
    cfg = load_config(None, ["sampling.max_tokens=8", f"model.path={path}", "engine.kind=hf"])
    engine = Spy(make_engine(cfg))
    proxy = ProxyServer(engine, engine.tokenizer, cfg)
    url = proxy.start()
    try:
        run_episode(url, "hf")
        traj = proxy.close_episode("hf")
    finally:
        proxy.stop()
        engine.close()
    check_token_invariant(engine, traj)
    traj.reward = 0.0
    batch = build_batch([traj])
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        logp, _ = policy_token_logprobs(model, batch.input_ids, batch.attention_mask, batch.action_mask)
    err = (logp - batch.logp_rollout)[batch.action_mask].abs().max().item()
    assert batch.action_mask.sum() >= len(SCRIPT) and err <= 1e-3, err


def test_qwen3_empty_think_replies_drift_but_never_break(tmp_path):
    """Qwen3 hybrid drops an empty think block from every assistant turn but the last: a full re-render
    disagrees with what the model saw (the trace's ``drift``), while the proxy keeps the sampled tokens."""
    fam = FAMILIES["qwen3"]
    tok = AutoTokenizer.from_pretrained(fam.model_dir())
    texts = [f"<think>\n\n</think>\n\n{fam.write_calls(calls) if calls else content}<|im_end|>"
             for _, content, calls, _ in SCRIPT]
    engine = Spy(ScriptedEngine(tok, texts, eos=False))
    proxy = ProxyServer(engine, tok, load_config(None, ["sampling.max_tokens=512"]))
    url = proxy.start()
    try:
        run_episode(url, "empty-think")
        traj = proxy.close_episode("empty-think")
    finally:
        proxy.stop()
    check_token_invariant(engine, traj)
    assert all(tok.decode(s.token_ids).startswith("<think>\n\n</think>") for s in traj.segments[1::2])
    drift = traj.metadata["drift"]
    assert "error" not in drift, drift
    assert not drift["equal"] and drift["proxy_tokens"] > drift["render_tokens"]


def test_template_that_cannot_be_anchored_is_refused_at_start():
    """A template that drops past assistant content: a TemplateError naming the cause, not a 500 later."""
    tok = AutoTokenizer.from_pretrained(FAMILIES["qwen2.5"].model_dir())
    drops = ("{%- for m in messages %}{%- if m.role != 'assistant' or loop.last %}<|im_start|>{{ m.role }}\n"
             "{{ m.content }}<|im_end|>\n{%- endif %}{%- endfor %}{%- if add_generation_prompt %}"
             "<|im_start|>assistant\n{%- endif %}")
    with pytest.raises(TemplateError, match="drops or rewrites an assistant turn's content"):
        ChatTemplate(tok, drops).check_continuable()


def test_published_templates_pick_their_parsers():
    from sao_harness.harness.proxy import default_parsers

    for fam in FAMILIES.values():
        assert default_parsers((TEMPLATES / fam.template).read_text()) == (fam.tool_parser, fam.reasoning_parser)


@pytest.mark.slow  # a `sao serve` process with a Qwen3-templated tiny model
def test_sao_serve_runs_a_qwen3_episode(tmp_path):
    """`sao serve` on a model directory that carries the Qwen3 template: a 6-turn episode, no error, no break."""
    path = FAMILIES["qwen3"].model_dir()
    proc, base = start_sao_serve("--model", str(path), f"run.root={tmp_path}", "run.name=qwen3",
                                 "sampling.max_tokens=8")
    try:
        run_episode(base + "/v1", "q3")
        closed = httpx.post(f"{base}/episodes/q3/close", timeout=30).json()
        assert closed["status"] == Status.OK and closed["turns"] == len(SCRIPT) and closed["breaks"] == []
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.mark.docker
def test_openhands_expert_episode_resolves_with_the_qwen3_template(docker_engine, project_root, tmp_path):
    """A real OpenHands episode (expert engine, compact profile, Docker sandbox, official grader) on a
    bundled task, with a model directory that carries the Qwen3 template and replies that think first
    (the SDK gets ``reasoning_content``): resolved, no break, no error, the reasoning kept in the trace."""
    from sao_harness.harness.engines.expert import ExpertEngine
    from sao_harness.harness.expert import image_file_reader
    from sao_harness.harness.rollout import run_rollout
    from sao_harness.tasks.formats.loaders import load_tasks

    path = FAMILIES["qwen3"].model_dir()
    tok = AutoTokenizer.from_pretrained(path)
    task = "sao-harness__minicfg-8"
    cfg = load_config(project_root / "configs/local.yaml", [
        f"run.root={tmp_path}", "run.name=qwen3", "engine.kind=expert", "agent.profile=compact",
        f"tasks.instances=[{task}]", "rollout.workers=1", "sampling.max_tokens=4096", "agent.stuck_detection=false",
        f"model.path={path}"])

    class ThinkingExpert(ExpertEngine):  # a thinking model: every reply opens with its reasoning
        def next_reply(self, prompt_ids):
            return f"<think>\nStep: edit the file, then finish.\n</think>\n\n{super().next_reply(prompt_ids)}"

    tasks = load_tasks("bundled", instances=[task])
    engine = ThinkingExpert(tok, tasks, read_file=image_file_reader(cfg.docker))
    proxy = ProxyServer(engine, tok, cfg)
    proxy.start(port=0)
    try:
        stats = run_rollout(cfg, tasks, engine=engine, proxy=proxy, log=lambda *_: None)
    finally:
        proxy.stop()
    assert stats.done == 1 and stats.resolved == 1
    (traj,) = list(TraceStore(cfg.run.dir))
    assert traj.status == Status.OK and traj.reward == 1.0 and traj.breaks == [] and traj.metadata["errors"] == []
    actions = [tok.decode(seg.token_ids) for seg in traj.segments if seg.kind == "action"]
    assert len(actions) >= 2 and all(a.startswith("<think>\nStep: ") for a in actions)


def test_a_request_the_template_refuses_is_a_400_not_a_500(tmp_path):
    """A template's raise_exception on a message (e.g. a role it does not allow) answers 400 template_error."""
    tok = AutoTokenizer.from_pretrained(FAMILIES["qwen2.5"].model_dir())
    strict = (TEMPLATES / "qwen2.5.jinja").read_text().replace(
        "{%- for message in messages %}",
        "{%- for message in messages %}{%- if 'FORBIDDEN' in message.content %}"
        "{{- raise_exception('this model does not take that message') }}{%- endif %}", 1)
    (tmp_path / "strict.jinja").write_text(strict)
    cfg = load_config(None, [f"proxy.chat_template={tmp_path / 'strict.jinja'}"])
    proxy = ProxyServer(ScriptedEngine(tok, ["ok"]), tok, cfg)
    url = proxy.start()
    try:
        r = httpx.post(url + "/chat/completions", json={"messages": [USER, {"role": "user", "content": "FORBIDDEN"}]},
                       timeout=30)
    finally:
        proxy.stop()
    assert r.status_code == 400 and r.json()["error"]["code"] == "template_error"
    assert "this model does not take that message" in r.json()["error"]["message"]


def test_chat_template_kwargs_reach_every_render():
    """Qwen3 hybrid with enable_thinking false: the generation prompt carries the empty think block."""
    tok = AutoTokenizer.from_pretrained(FAMILIES["qwen3"].model_dir())
    cfg = load_config(None, ["proxy.chat_template_kwargs={enable_thinking: false}"])
    proxy = ProxyServer(ScriptedEngine(tok, []), tok, cfg)
    after = proxy.template.after_reply(None, [{"role": "user", "content": "go on"}], None, [])
    assert after.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert proxy.template.render([USER], None, True).endswith("<think>\n\n</think>\n\n")
