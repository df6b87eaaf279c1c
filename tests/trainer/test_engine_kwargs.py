"""A replica's engine gets ``runtime.weight_bucket_mb`` from the trainer (the engine itself reads no trainer section):
as ``bucket_bytes`` for a kind that re-buckets weight updates (vllm), nothing for one that does not (hf)."""
from sao_harness.sao.config import load_config
from sao_harness.trainer.run.actors import engine_kwargs


def test_the_bucket_size_goes_to_the_kinds_that_take_it():
    vllm = load_config(None, ["engine.kind=vllm", "runtime.weight_bucket_mb=64"])
    assert engine_kwargs(vllm) == {"bucket_bytes": 64 * 2**20}
    assert engine_kwargs(load_config(None, ["runtime.weight_bucket_mb=64"])) == {}  # hf: from_config takes none
