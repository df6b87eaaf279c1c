"""Config: typed, validated, one-line errors naming the key or path, exit code 2 before any work."""
import importlib.metadata
import json
import re
import subprocess
import sys

import pytest
import yaml

from sao_harness.core.config import ConfigError, Section
from sao_harness.sao.cli import main
from sao_harness.sao.config import MOVED_KEYS, Config, config_keys, config_table, load_config
from sao_harness.trainer.config import TrainerConfig


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
    ("trainer.env=docker",
     "config key 'trainer.env': Value error, unknown env 'docker' (known: chain, simulated, swe, toy)"),
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
    return subprocess.run([sys.executable, "-m", "sao_harness.sao.cli",
                           *args], cwd=cwd, check=False, capture_output=True,
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


# a valid value that is not the default, per new key of MOVED_KEYS
MOVED_VALUES = {
    "sampling.temperature": 0.7, "sampling.top_k": 20, "sampling.top_p": 0.9,
    "runtime.ray_address": "10.0.0.1:6379", "runtime.world_size": 2, "runtime.device": "cuda",
    "runtime.offload_optimizer": True, "runtime.weight_sync": "collective", "runtime.weight_bucket_mb": 64.0,
    "runtime.weight_sync_host": "10.0.0.2", "runtime.keep_checkpoints": 5, "runtime.poll_interval_s": 0.5,
    "runtime.batch_timeout_s": 60.0, "runtime.publish_timeout_s": 30.0, "runtime.actor_timeout_s": 90.0,
    "testbed.toy.turns": 5, "testbed.toy.target": "turn", "testbed.toy.repeat": 3, "testbed.toy.stakes": 0.25,
    "testbed.simulated.turns_median": 2.0, "testbed.simulated.turns_sigma": 0.5, "testbed.simulated.turns_max": 8,
    "testbed.simulated.env_sleep_s": 0.5, "testbed.simulated.infra_error_rate": 0.1,
    "testbed.simulated.engine_s": 0.01,
    "grading.timeout_s": 60.0, "grading.output_cap_bytes": 1000, "grading.guard": False,
    "engine.tensor_parallel_size": 2,
}
# an `a.b.*` entry of MOVED_KEYS is tried with one key under it, beside the overrides that key needs
WILDCARD_KEYS = {"engine.options.*": ("tensor_parallel_size", ["engine.kind=vllm"])}


def _moved(old: str, new: str) -> tuple[str, str, list[str]]:
    """``(old, new, overrides)`` of a MOVED_KEYS entry, a `.*` one with its key of WILDCARD_KEYS."""
    if not old.endswith(".*"):
        return old, new, []
    key, extra = WILDCARD_KEYS[old]
    return old[:-1] + key, new[:-1] + key, extra


def _get(cfg, dotted: str):
    for name in dotted.split("."):
        cfg = getattr(cfg, name)
    return cfg


@pytest.mark.parametrize("old, new, removed_in", sorted((old, *move) for old, move in MOVED_KEYS.items()))
def test_a_moved_key_still_loads_in_its_old_place_with_a_warning(old, new, removed_in):
    """The old key (an override here) lands at the new key, with a one-line FutureWarning naming the new key
    and the version that removes the old one."""
    old, new, extra = _moved(old, new)
    value = MOVED_VALUES[new]
    assert value != _get(load_config(None, extra), new)  # else the test could not tell the move from the default
    version = tuple(map(int, importlib.metadata.version("sao-harness").split(".")))
    assert tuple(map(int, removed_in.split("."))) > version, f"{old}: removed in {removed_in}, so remove it now"
    with pytest.warns(FutureWarning, match=rf"^{re.escape(old)} is deprecated: use {re.escape(new)} "
                                           rf"\({re.escape(old)} is removed in {re.escape(removed_in)}\)$"):
        cfg = load_config(None, [*extra, f"{old}={json.dumps(value)}"])
    assert _get(cfg, new) == value


def test_moved_keys_in_a_file_and_every_moved_key_covered(tmp_path):
    assert set(MOVED_VALUES) == {_moved(old, new)[1] for old, (new, _) in MOVED_KEYS.items()}
    f = tmp_path / "old.yaml"
    f.write_text("trainer:\n  env: toy\n  toy_turns: 4\n  world_size: 2\n  top_k: 16\n")
    with pytest.warns(FutureWarning):
        cfg = load_config(f)
    assert (cfg.testbed.toy.turns, cfg.runtime.world_size, cfg.sampling.top_k, cfg.trainer.env) == (4, 2, 16, "toy")
    assert "toy_turns" not in TrainerConfig.model_fields and "world_size" not in TrainerConfig.model_fields


def test_an_old_key_that_disagrees_with_its_new_key_is_an_error():
    with pytest.raises(ConfigError, match=r"trainer.temperature \(0.5\) is deprecated and sampling.temperature "
                                          r"\(0.7\) is set too: keep only sampling.temperature"):
        load_config(None, ["trainer.temperature=0.5", "sampling.temperature=0.7"])
    with pytest.raises(ConfigError, match=r"keep only testbed.toy.turns"):
        load_config(None, ["trainer.toy_turns=4", "testbed.toy.turns=5"])
    with pytest.warns(FutureWarning):  # the same value twice: no conflict
        assert load_config(None, ["trainer.world_size=2", "runtime.world_size=2"]).runtime.world_size == 2


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
