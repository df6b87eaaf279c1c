"""The engine registry: a new engine kind is one ``EngineSpec``, and config validation, ``make_engine`` and every
capability query take it with no change anywhere else; an unknown kind is refused with the known ones."""
import subprocess
import sys

import pytest
from pydantic import BaseModel, ConfigDict
from transformers import AutoTokenizer

from sao_harness.core.config import ConfigError
from sao_harness.core.errors import UserError
from sao_harness.harness.engines import make_engine, registry
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


class EchoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token: int = 7  # the token every reply repeats


class EchoEngine(Engine):
    """The fake: every reply is ``max_tokens`` copies of ``engine.options.token``."""

    kind = "echo"

    def __init__(self, token: int, timeout_s: float):
        self.token, self.timeout_s, self._version = token, timeout_s, 0

    @classmethod
    def from_config(cls, cfg, **kwargs):
        return cls(cfg.engine.options["token"], cfg.engine.timeout_s, **kwargs)

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


ECHO = EngineSpec("echo", EchoEngine, "a fake that repeats one token", options=EchoOptions, devices=("cpu", "cuda"),
                  weight_syncs=("object_store",), gpus_key="tensor_parallel_size", tool_parsers=("qwen3_coder",))


@pytest.fixture
def fresh_registry(monkeypatch):
    """The built-in kinds only; whatever a test registers is gone after it."""
    monkeypatch.setattr(registry, "ENGINES", dict(registry.ENGINES))


def test_a_new_engine_is_refused_until_registered_then_used_everywhere(fresh_registry, tiny_model_dir):
    with pytest.raises(ConfigError, match=r"unknown engine.kind 'echo' \(known: expert, hf, scripted, vllm\)"):
        load_config(None, ["engine.kind=echo"])
    register_engine(ECHO)

    cfg = load_config(None, ["engine.kind=echo", "engine.options={token: 3}", "engine.tensor_parallel_size=2"])
    engine = make_engine(cfg)
    assert isinstance(engine, EchoEngine) and engine.generate([1], SamplingParams(max_tokens=2)).token_ids == [3, 3]
    assert load_config(None, ["engine.kind=echo"]).engine.options == {"token": 7}  # the options model's default
    with pytest.raises(ConfigError, match=r"engine.options.tokn of engine.kind=echo"):
        load_config(None, ["engine.kind=echo", "engine.options={tokn: 3}"])

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
    vllm, hf = (load_config(None, [f"engine.kind={k}", "engine.tensor_parallel_size=4"]).engine for k in ("vllm", "hf"))
    assert (replica_gpus(vllm), replica_gpus(hf)) == (4, 0)
    assert engine_spec("vllm").needs_vllm and not engine_spec("hf").needs_vllm
    assert engine_spec("expert").tool_parsers is None and engine_spec("hf").tool_parsers is None  # any format
    scripted = load_config(None, ["engine.kind=scripted", "engine.gpus_per_replica=1"])
    assert wants_gpu(scripted) == []  # a CPU-only kind asks no GPU of the doctor


def test_unknown_kinds_and_bad_specs_are_errors(fresh_registry):
    with pytest.raises(ValueError, match=r"unknown engine.kind 'tpu' \(known: expert, hf, scripted, vllm\)"):
        engine_spec("tpu")
    with pytest.raises(ValueError, match="'hf' is registered already"):
        register_engine(EngineSpec("hf", EchoEngine, "a second hf"))
    with pytest.raises(ValueError, match="weight_syncs a non-empty subset"):
        register_engine(EngineSpec("bad", EchoEngine, "a bad transport", weight_syncs=("rdma",)))
    with pytest.raises(ConfigError, match="engine.kind=hf takes no options"):
        load_config(None, ["engine.options={token: 3}"])


def test_registering_the_built_ins_imports_neither_torch_nor_vllm():
    code = ("import sys, sao_harness.harness.engines as engines, sao_harness.harness.config\n"
            "assert set(engines.ENGINES) >= {'hf', 'vllm', 'scripted', 'expert'}\n"
            "print(sorted(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
