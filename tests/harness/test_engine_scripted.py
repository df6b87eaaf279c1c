"""The scripted test double and the make_engine factory."""
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from sao_harness.harness.engines import make_engine, sampling_from_config
from sao_harness.harness.engines.protocol import EngineError, EngineTimeout, SamplingParams
from sao_harness.harness.engines.scripted import ScriptedEngine
from sao_harness.harness.tiny_model import ensure_tiny_model
from sao_harness.sao.config import load_config

REPO = Path(__file__).resolve().parents[2]
REPLY = 'Let me look.\n<tool_call>\n{"name": "terminal", "arguments": {"command": "ls"}}\n</tool_call>'


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(ensure_tiny_model(REPO / ".cache" / "sao", 0))


def test_replays_replies_as_tokens_with_zero_logprobs(tok):
    eng = ScriptedEngine(tok, [REPLY, "done"])
    res = eng.generate([1, 2], SamplingParams())
    assert res.token_ids[-1] == tok.eos_token_id and res.finish_reason == "stop"
    assert tok.decode(res.token_ids[:-1], skip_special_tokens=False) == REPLY
    assert res.logprobs == [0.0] * len(res.token_ids) and res.versions == [0] * len(res.token_ids)
    eng.update_weights(4, {})
    res = eng.generate([1], SamplingParams())
    assert res.versions == [4] * len(res.token_ids) and eng.health()["replies_left"] == 0
    with pytest.raises(EngineError, match="no scripted replies left"):
        eng.generate([1], SamplingParams())


def test_honours_stop_strings_and_max_tokens(tok):
    eng = ScriptedEngine(tok, ["abc <function=x> body </function> tail", "a b c d e f g h"])
    res = eng.generate([1], SamplingParams(stop=("</function",)))
    assert res.finish_reason == "stop" and res.stop_str == "</function"
    assert tok.decode(res.token_ids).endswith("</function")
    res = eng.generate([1], SamplingParams(max_tokens=3))
    assert res.finish_reason == "length" and len(res.token_ids) == 3


def test_delay_beyond_timeout_raises(tok):
    eng = ScriptedEngine(tok, ["x"], timeout_s=0.05, delay_s=1.0)
    with pytest.raises(EngineTimeout):
        eng.generate([1], SamplingParams())


def test_make_engine_by_kind(tok):
    cfg = load_config(None, ["engine.kind=scripted", f"model.cache_dir={REPO / '.cache' / 'sao'}",
                             "sampling.temperature=0.5", "sampling.max_tokens=7"])
    eng = make_engine(cfg, replies=["hi"])
    assert isinstance(eng, ScriptedEngine) and eng.health()["ok"]
    sp = sampling_from_config(cfg, top_p=0.9, max_tokens=None)
    assert (sp.temperature, sp.top_p, sp.max_tokens) == (0.5, 0.9, 7)
    cfg = load_config(None, ["engine.kind=vllm", f"model.cache_dir={REPO / '.cache' / 'sao'}"])
    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(EngineError, match="needs vLLM"):
            make_engine(cfg)


def test_make_engine_expert_replies_by_task_and_turn(tok):
    from sao_harness.harness.engines.expert import ExpertEngine
    from sao_harness.tasks.formats.loaders import load_tasks

    cfg = load_config(None, ["engine.kind=expert", f"model.cache_dir={REPO / '.cache' / 'sao'}"])
    [task] = load_tasks("bundled", instances=["sao-harness__minicfg-8"])
    eng = make_engine(cfg, tasks=[task], read_file=None)  # no file reader: the gold patch's hunk-wide edits
    assert isinstance(eng, ExpertEngine) and eng.health()["tasks"] == 1

    def turn(prompt):
        ids = eng.generate(prompt, SamplingParams(max_tokens=4096)).token_ids
        return ids, tok.decode(ids[:-1])

    prompt = tok.encode(f"<|im_start|>user\n{task.problem_statement}<|im_end|>\n<|im_start|>assistant\n",
                        add_special_tokens=False)
    first, text = turn(prompt)
    assert '"str_replace"' in text and turn(prompt)[1] == text  # the turn: the replies already in the prompt
    observation = tok.encode("\n<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    assert '"finish"' in turn(prompt + first + observation)[1]
    assert eng.health()["planned"] == 1
