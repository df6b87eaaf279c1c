"""A chat template the proxy cannot serve tools with is a user error found at start (pre-flight of
`sao rollout` / `sao train` / `sao eval`, `sao config`, `sao doctor`), with the fix for that template,
never an infra error per episode (harness.proxy.tool_support)."""
import shutil
import sys
import types
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from sao_harness.harness.config import ProxyConfig
from sao_harness.harness.proxy.template import ChatTemplate
from sao_harness.harness.proxy.tool_support import model_tool_support, tool_support

FIXTURES = Path(__file__).parent / "fixtures" / "templates"
# HuggingFaceTB/SmolLM2-135M-Instruct's chat template, as published: ChatML that never renders `tools`
SMOLLM2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
           "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
           "<|im_end|>\n' }}"
           "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
           "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
QWEN25 = (FIXTURES / "qwen2.5.jinja").read_text()
MISTRAL_NEMO = (FIXTURES / "more" / "mistralai-Mistral-Nemo-Instruct-2407.jinja").read_text()


def model_dir(base: Path, out: Path, chat_template: str) -> Path:
    """A model directory (config.json + the tiny tokenizer) whose tokenizer carries ``chat_template``; no
    weights: nothing here may load the model."""
    tok = AutoTokenizer.from_pretrained(base)
    tok.chat_template = chat_template
    tok.save_pretrained(out)
    shutil.copy(base / "config.json", out / "config.json")
    return out


@pytest.fixture
def no_episode(monkeypatch):
    """The rollout itself stubbed (no engine, Docker or episode); ``calls`` records that it was reached."""
    from sao_harness.harness import rollout
    from sao_harness.harness.rollout import RolloutStats

    calls = []
    monkeypatch.setattr(rollout, "run_rollout", lambda cfg, tasks, **kw: calls.append(cfg) or RolloutStats())
    return calls


def _rollout(tmp_path, model, *overrides):
    from sao_harness.sao.cli import main

    return main(["rollout", "--config", "configs/local.yaml", f"model.path={model}", f"run.root={tmp_path / 'runs'}",
                 *overrides])


# --- the verdict on a template -------------------------------------------------------------------
def test_the_verdict_names_the_fix_that_applies_to_the_template(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    native, prompt = ProxyConfig(), ProxyConfig(tool_format="prompt")
    ignores = tool_support(ChatTemplate(tok, SMOLLM2), native, "SmolLM2")
    assert ignores.status == "FAIL" and "ignores `tools`" in ignores.detail
    assert "proxy.tool_format=prompt" in ignores.fix and "\n" not in ignores.message()
    unknown = tool_support(ChatTemplate(tok, MISTRAL_NEMO), native)  # renders tools, a call format we do not parse
    assert unknown.status == "FAIL" and unknown.fix.startswith("proxy.tool_parser=")
    assert tool_support(ChatTemplate(tok, MISTRAL_NEMO), ProxyConfig(tool_parser="hermes")).ok
    assert tool_support(ChatTemplate(tok, SMOLLM2), prompt).ok
    qwen = tool_support(ChatTemplate(tok, QWEN25), native)
    assert qwen.status == "ok" and "parser hermes" in qwen.detail


def test_the_tiny_model_serves_native_tools(tiny_model_dir, tmp_path):
    """Its template (harness.tiny_model.CHAT_TEMPLATE) passes on its tokenizer, so `tiny` is not loaded
    (nor built) for the check."""
    from sao_harness.harness.config import ModelConfig
    from sao_harness.harness.proxy.template import template_from_config

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert tool_support(template_from_config(tok, ProxyConfig()), ProxyConfig()).status == "ok"
    unbuilt = ModelConfig(path="tiny", cache_dir=str(tmp_path / "empty"))
    assert model_tool_support(unbuilt, ProxyConfig()).status == "ok"
    assert model_tool_support(unbuilt, ProxyConfig(tool_parser="glm45"), local_only=True).status == "--"
    assert not (tmp_path / "empty").exists()


# --- sao rollout: refused before any episode -------------------------------------------------------
def test_rollout_refuses_a_template_that_ignores_tools_before_any_episode(tiny_model_dir, tmp_path, capsys,
                                                                          no_episode, monkeypatch):
    """The issue's case (SmolLM2's template, proxy.tool_format native): exit 2 with one line naming
    proxy.tool_format=prompt; no episode, engine or Docker was reached."""
    import sao_harness.envs.engine as docker_engine

    monkeypatch.setattr(docker_engine, "ensure_engine", lambda *a, **k: pytest.fail("Docker was reached"))
    model = model_dir(tiny_model_dir, tmp_path / "smollm2", SMOLLM2)
    assert _rollout(tmp_path, model) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("sao rollout: proxy.tool_format=native") and \
        "proxy.tool_format=prompt" in err and "ignores `tools`" in err, err
    assert no_episode == [] and not (tmp_path / "runs").exists()


def test_rollout_with_the_prompt_tool_format_passes_the_check(tiny_model_dir, tmp_path, no_episode):
    model = model_dir(tiny_model_dir, tmp_path / "smollm2", SMOLLM2)
    assert _rollout(tmp_path, model, "proxy.tool_format=prompt") == 0
    assert len(no_episode) == 1


def test_rollout_with_a_qwen_template_and_native_tools_passes_the_check(tiny_model_dir, tmp_path, no_episode):
    model = model_dir(tiny_model_dir, tmp_path / "qwen2.5", QWEN25)
    assert _rollout(tmp_path, model) == 0
    assert len(no_episode) == 1


def test_start_policy_refuses_before_the_engine_starts(tiny_model_dir, tmp_path, monkeypatch):
    """A caller that bypasses the CLI (eval's predictions, bench) is refused before the engine is made."""
    from sao_harness.core.errors import UserError
    from sao_harness.harness import rollout
    from sao_harness.sao.config import load_config

    monkeypatch.setattr(rollout, "make_engine", lambda cfg: pytest.fail("the engine was started"))
    model = model_dir(tiny_model_dir, tmp_path / "smollm2", SMOLLM2)
    with pytest.raises(UserError, match="proxy.tool_format=prompt"):
        rollout.start_policy(load_config(None, [f"model.path={model}"]))


# --- sao train, sao eval, sao config, sao doctor --------------------------------------------------
def test_train_and_eval_refuse_it_before_their_own_preflight(tiny_model_dir, tmp_path, capsys, monkeypatch):
    from sao_harness.sao.cli import main

    monkeypatch.setitem(sys.modules, "sao_harness.trainer.run.loop", types.SimpleNamespace(
        LoopError=RuntimeError, train=lambda cfg, log: pytest.fail("training started")))
    import sao_harness.eval.run as eval_run

    monkeypatch.setattr(eval_run, "run_eval", lambda cfg, **kw: pytest.fail("the eval started"))
    model = model_dir(tiny_model_dir, tmp_path / "smollm2", SMOLLM2)
    for cmd in ("train", "eval"):
        runs = f"run.root={tmp_path / 'runs'}"
        assert main([cmd, "--config", "configs/local.yaml", f"model.path={model}", runs]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"sao {cmd}: ") and err.count("\n") == 1 and "proxy.tool_format=prompt" in err, err


def test_sao_config_and_doctor_report_it(tiny_model_dir, tmp_path, capsys):
    from sao_harness.sao.cli import main
    from sao_harness.sao.config import load_config
    from sao_harness.sao.doctor import check_tools

    model = model_dir(tiny_model_dir, tmp_path / "smollm2", SMOLLM2)
    assert main(["config", f"model.path={model}"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1 and "proxy.tool_format=prompt" in out.err
    assert main(["config", f"model.path={model}", "proxy.tool_format=prompt"]) == 0
    assert "\n# tools: proxy.tool_format=prompt" in capsys.readouterr().out
    line = check_tools(load_config(None, [f"model.path={model}"])).line()
    assert line.startswith("FAIL  tools") and "fix: proxy.tool_format=prompt" in line
    assert check_tools(load_config(None, [f"model.path={model}", "proxy.tool_format=prompt"])).status == "ok"
