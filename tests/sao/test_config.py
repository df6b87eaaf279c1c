"""Config: typed, validated, one-line errors naming the key or path, exit code 2 before any work."""
import json
import subprocess
import sys

import pytest
import yaml

from core.config import Section
from sao.cli import main
from sao.config import Config, ConfigError, config_keys, config_table, load_config


def test_both_shipped_configs_validate(project_root):
    local = load_config(project_root / "configs/local.yaml")
    assert local.model.path == "tiny" and local.engine.kind == "hf" and local.tasks.source == "bundled"
    real = load_config(project_root / "configs/swe-verified.yaml")
    assert real.engine.kind == "vllm" and real.proxy.context_budget == 131072
    assert real.agent.max_iterations == 300 and real.trainer.batch_size == 128
    assert (real.trainer.eps_low, real.trainer.eps_high, real.trainer.critic_steps) == (0.8, 3.0, 2)


def test_overrides_are_typed_and_applied(project_root):
    cfg = load_config(project_root / "configs/local.yaml", ["trainer.lr=1e-6", "rollout.workers=7",
                                                            "tasks.instances=[a, b]",
                                                            "trainer.whiten_advantages=false"])
    assert cfg.trainer.lr == pytest.approx(1e-6) and isinstance(cfg.trainer.lr, float)
    assert cfg.rollout.workers == 7
    assert cfg.tasks.instances == ["a", "b"]
    assert cfg.trainer.whiten_advantages is False


def test_defaults_without_file():
    assert isinstance(load_config(None), Config)


@pytest.mark.parametrize("override, needle", [
    ("bogus.key=1", "unknown config key 'bogus.key'"),
    ("trainer.bogus=1", "unknown config key 'trainer.bogus'"),
    ("trainer.lr=abc", "config key 'trainer.lr'"),
    ("rollout.workers=0", "config key 'rollout.workers'"),
    ("engine.kind=tpu", "config key 'engine.kind'"),
    ("trainer.lr", "not of the form key.sub=value"),
])
def test_bad_override_names_the_key(project_root, override, needle):
    with pytest.raises(ConfigError) as e:
        load_config(project_root / "configs/local.yaml", [override])
    assert needle in str(e.value)
    assert "\n" not in str(e.value)


def test_unknown_key_in_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("trainer:\n  lr: 1.0e-6\n  lrr: 2\n")
    with pytest.raises(ConfigError, match=r"c.yaml: unknown config key 'trainer.lrr'"):
        load_config(f)


def test_bad_type_in_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("sampling:\n  temperature: hot\n")
    with pytest.raises(ConfigError, match=r"config key 'sampling.temperature'"):
        load_config(f)


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match=r"config file not found: .*nope.yaml"):
        load_config(tmp_path / "nope.yaml")
    f = tmp_path / "bad.yaml"
    f.write_text("trainer: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: invalid YAML"):
        load_config(f)


def _sao(*args, cwd):
    return subprocess.run([sys.executable, "-m", "sao.cli", *args], cwd=cwd, check=False, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("args, needle", [
    (["train", "--config", "configs/local.yaml", "bogus.key=1"], "bogus.key"),
    (["rollout", "--config", "configs/local.yaml", "trainer.lr=abc"], "trainer.lr"),
    (["eval", "--config", "configs/missing.yaml"], "configs/missing.yaml"),
])
def test_cli_config_errors_exit_2_one_line_no_traceback(project_root, args, needle):
    r = _sao(*args, cwd=project_root)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_trainer_recomputes_logprobs_under_the_rollout_sampling(project_root):
    cfg = load_config(project_root / "configs/local.yaml", ["sampling.temperature=0.7", "sampling.top_k=20"])
    assert (cfg.trainer.temperature, cfg.trainer.top_k, cfg.trainer.top_p) == (0.7, 20, 1.0)
    with pytest.raises(ConfigError, match=r"trainer.temperature \(0.5\) differs from sampling.temperature \(1.0\)"):
        load_config(project_root / "configs/local.yaml", ["trainer.temperature=0.5"])


def test_every_key_has_a_description_and_every_section_a_docstring():
    """`sao config --markdown` (docs/config.md's table) is generated from these: none may be empty."""
    undescribed = [key for key, _, description in config_keys(Config()) if not description.strip()]
    assert not undescribed, f"config keys without Field(description=...): {undescribed}"
    sections = {type(getattr(Config(), name)) for name in Config.model_fields}
    assert all(s.__doc__ and s.__doc__ != Section.__doc__ for s in sections | {Config})


def test_sections_forbid_unknown_keys():
    """Every section shares core.config.Section: unknown keys are errors, assignments are validated."""
    for name in Config.model_fields:
        section = getattr(Config(), name)
        assert isinstance(section, Section), name
        with pytest.raises(ValueError):
            setattr(section, next(iter(type(section).model_fields)), object())


def test_config_markdown_rows():
    table = config_table().splitlines()
    assert table[:2] == ["| key | default | description |", "|---|---|---|"]
    assert len(table) == 2 + len(list(config_keys(Config())))
    assert "| `trainer.lr` | `1e-06` | policy AdamW learning rate [paper] |" in table
    assert any(row.startswith("| `engine.max_model_len` | `null` |") for row in table)
    assert any(row.startswith("| `sandbox.cap_add` | `[]` |") for row in table)


def test_sao_config_prints_the_context_budget_in_force(tiny_model_dir, tmp_path, capsys):
    """After the YAML, a comment: the budget the proxy will enforce and where it comes from (here the
    model's max_position_embeddings, below proxy.context_budget); the output stays a config file."""
    model = tmp_path / "short-model"
    model.mkdir()
    config = json.loads((tiny_model_dir / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config | {"max_position_embeddings": 64}))
    assert main(["config", f"model.path={model}"]) == 0
    out = capsys.readouterr().out
    assert out.endswith(f"\n# context budget 64 tokens (from max_position_embeddings of {model})\n")
    assert yaml.safe_load(out)["model"]["path"] == str(model)
    assert main(["config", "proxy.context_budget=1000"]) == 0
    assert capsys.readouterr().out.endswith("# context budget 1000 tokens (from proxy.context_budget; the model "
                                            "allows 262144)\n")
