"""The engine registry: a new engine kind is one ``EngineSpec`` (its config model among them), and config
validation, ``make_engine`` and every capability query take it with no change anywhere else; an unknown kind is
refused with the known ones, a key of another kind with the kind's keys."""
import subprocess
import sys
from typing import Literal

import pytest
from pydantic import Field
from transformers import AutoTokenizer

from sao_harness.core.config import ConfigError
from sao_harness.core.errors import UserError
from sao_harness.harness.engines import EngineBase, make_engine, registry
from sao_harness.harness.engines.protocol import Engine, GenerateResult, SamplingParams
from sao_harness.harness.engines.registry import (
    EngineSpec,
    engine_spec,
    register_engine,
    replica_gpus,
    weight_sync_transport,
)
from sao_harness.harness.engines.vllm_env import engine_runtime_env
from sao_harness.harness.proxy.server import ProxyServer
from sao_harness.sao.config import load_config
from sao_harness.sao.doctor import check_vllm, wants_gpu


class EchoConfig(EngineBase):
    """``engine.kind: echo``."""

    kind: Literal["echo"] = "echo"
    token: int = Field(7, description="the token every reply repeats")
    tensor_parallel_size: int = Field(1, gt=0, description="its gpus_key")


class EchoEngine(Engine):
    """The fake: every reply is ``max_tokens`` copies of ``engine.token``."""

    kind = "echo"

    def __init__(self, token: int, timeout_s: float):
        self.token, self.timeout_s, self._version = token, timeout_s, 0

    @classmethod
    def from_config(cls, cfg, **kwargs):
        return cls(cfg.engine.token, cfg.engine.timeout_s, **kwargs)

    @property
    def version(self):
        return self._version

    def generate(self, prompt_ids, sampling, timeout=None):
        n = sampling.max_tokens
        return GenerateResult([self.token] * n, [0.0] * n, "length", [self._version] * n)

    def update_weights(self, version, weights, timeout=None):
        self._version = version

    def health(self):
        return {"ok": True, "kind": self.kind, "version": self._version}


ECHO = EngineSpec("echo", EchoEngine, "a fake that repeats one token", EchoConfig, devices=("cpu", "cuda"),
                  weight_syncs=("object_store",), gpus_key="tensor_parallel_size", tool_parsers=("qwen3_coder",))


@pytest.fixture
def fresh_registry(monkeypatch):
    """The built-in kinds only; whatever a test registers is gone after it."""
    monkeypatch.setattr(registry, "ENGINES", dict(registry.ENGINES))


def test_a_new_engine_is_refused_until_registered_then_used_everywhere(fresh_registry, tiny_model_dir):
    with pytest.raises(ConfigError, match=r"unknown engine.kind 'echo' \(known: expert, hf, scripted, vllm\)"):
        load_config(None, ["engine.kind=echo"])
    register_engine(ECHO)

    cfg = load_config(None, ["engine.kind=echo", "engine.token=3", "engine.tensor_parallel_size=2"])
    engine = make_engine(cfg)
    assert isinstance(engine, EchoEngine) and engine.generate([1], SamplingParams(max_tokens=2)).token_ids == [3, 3]
    assert load_config(None, ["engine.kind=echo"]).engine.token == 7  # the config model's default
    with pytest.raises(ConfigError, match=r"config key 'engine.tokn': engine.kind=echo does not take 'tokn' \(not a "
                                          r"key of any engine kind\); its keys: kind, timeout_s, .*, token, "
                                          r"tensor_parallel_size \(got 3\)$"):
        load_config(None, ["engine.kind=echo", "engine.tokn=3"])
    with pytest.raises(ConfigError, match=r"'engine.max_batch': engine.kind=echo does not take 'max_batch' \(a key "
                                          r"of engine.kind=hf\)"):
        load_config(None, ["engine.kind=echo", "engine.max_batch=4"])
    with pytest.warns(FutureWarning, match=r"^engine.options.token is deprecated: use engine.token "
                                           r"\(engine.options.token is removed in 0.2.0\)$"):
        assert load_config(None, ["engine.kind=echo", "engine.options={token: 5}"]).engine.token == 5

    # the capability queries the trainer, the GPU plan, the doctor and the proxy make
    assert weight_sync_transport("echo", "auto") == "object_store"  # the spec's first transport
    with pytest.raises(ValueError, match="weight_sync=collective: engine.kind=echo takes object_store"):
        weight_sync_transport("echo", "collective")
    assert replica_gpus(cfg.engine) == 2  # gpus_key: engine.tensor_parallel_size
    gpu = load_config(None, ["engine.kind=echo", "engine.gpus_per_replica=1"])
    assert "engine.gpus_per_replica" in wants_gpu(gpu)
    assert engine_runtime_env(cfg.engine) is None and check_vllm(cfg.engine, version=lambda python: None).status == "--"
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)  # its template teaches hermes, the fake writes qwen3_coder
    with pytest.raises(UserError, match="engine.kind=echo writes qwen3_coder tool calls, but the parser in force is "
                                        "hermes"):
        ProxyServer(engine, tok, cfg)
    ProxyServer(engine, tok, load_config(None, ["engine.kind=echo", "proxy.tool_parser=qwen3_coder"]))


def test_the_built_in_kinds_answer_as_the_old_branches_did():
    assert [weight_sync_transport(k, "auto") for k in ("hf", "vllm", "scripted", "expert")] == \
        ["object_store", "collective", "object_store", "object_store"]
    vllm = load_config(None, ["engine.kind=vllm", "engine.tensor_parallel_size=4"]).engine
    assert (replica_gpus(vllm), replica_gpus(load_config(None).engine)) == (4, 0)
    assert engine_spec("vllm").needs_vllm and not engine_spec("hf").needs_vllm
    assert engine_spec("expert").tool_parsers is None and engine_spec("hf").tool_parsers is None  # any format
    scripted = load_config(None, ["engine.kind=scripted", "engine.gpus_per_replica=1"])
    assert wants_gpu(scripted) == []  # a CPU-only kind asks no GPU of the doctor


def test_unknown_kinds_and_bad_specs_are_errors(fresh_registry):
    with pytest.raises(ValueError, match=r"unknown engine.kind 'tpu' \(known: expert, hf, scripted, vllm\)"):
        engine_spec("tpu")
    with pytest.raises(ValueError, match="'hf' is registered already"):
        register_engine(EngineSpec("hf", EchoEngine, "a second hf", EchoConfig))
    with pytest.raises(ValueError, match="weight_syncs a non-empty subset"):
        register_engine(EngineSpec("bad", EchoEngine, "a bad transport", EchoConfig, weight_syncs=("rdma",)))
    with pytest.raises(ValueError, match=r"config model EchoConfig must declare kind: Literal\['echo2'\]"):
        register_engine(EngineSpec("echo2", EchoEngine, "another kind's model", EchoConfig))
    with pytest.raises(ValueError, match=r"must declare kind: Literal\['echo'\], gpu_memory_utilization"):
        register_engine(EngineSpec("echo", EchoEngine, "a GPU plan without its key", EchoConfig, gpu_kv_cache=True))
    with pytest.warns(FutureWarning), pytest.raises(ConfigError, match="engine.kind=hf does not take 'token'"):
        load_config(None, ["engine.options={token: 3}"])


def test_an_override_of_the_kind_drops_the_files_keys_of_the_old_kind(tmp_path):
    """`--config vllm.yaml engine.kind=hf`: the file's vllm keys go, the keys hf takes stay; a key set by an
    override is always checked, and so is the file's when the kind stays."""
    f = tmp_path / "vllm.yaml"
    f.write_text("engine:\n  kind: vllm\n  device: cuda\n  tensor_parallel_size: 4\n  max_batch: 2\n")
    hf = load_config(f, ["engine.kind=hf"]).engine
    assert (hf.kind, hf.device, hf.max_batch) == ("hf", "cuda", 2)
    with pytest.raises(ConfigError, match="engine.kind=hf does not take 'tensor_parallel_size'"):
        load_config(f, ["engine.kind=hf", "engine.tensor_parallel_size=2"])
    with pytest.raises(ConfigError, match="engine.kind=vllm does not take 'max_batch'"):
        load_config(f, ["engine.kind=vllm"])


def test_a_flat_engine_section_of_an_older_dump_loads_and_a_set_key_of_another_kind_does_not(tmp_path):
    """Configs written before the per-kind sections (`sao config`, a `sao paper` run's paper.yaml) hold every
    kind's keys at their defaults: those of another kind are dropped with a FutureWarning; one set to
    another value is still an error (it would be ignored)."""
    flat = ("engine:\n  kind: hf\n  device: cpu\n  max_batch: 8\n  num_threads: 0\n  tensor_parallel_size: 1\n"
            "  gpu_memory_utilization: 0.85\n  vllm_args: {}\n  kv_cache_bytes: null\n  vllm_python: null\n")
    f = tmp_path / "old.yaml"
    f.write_text(flat)
    with pytest.warns(FutureWarning, match=r"engine.tensor_parallel_size is not a key of engine.kind=hf"):
        engine = load_config(f, []).engine
    assert engine.kind == "hf" and not hasattr(engine, "tensor_parallel_size")
    f.write_text(flat.replace("tensor_parallel_size: 1", "tensor_parallel_size: 2"))
    with pytest.raises(ConfigError, match="engine.kind=hf does not take 'tensor_parallel_size'"):
        load_config(f, [])


def test_registering_the_built_ins_imports_neither_torch_nor_vllm():
    code = ("import sys, sao_harness.harness.engines as engines, sao_harness.harness.config\n"
            "assert set(engines.ENGINES) >= {'hf', 'vllm', 'scripted', 'expert'}\n"
            "print(sorted(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
