"""Three fidelity fixes of the trainer: sliding-window attention on packed rows
(trainer.modeling.models.use_packed_sdpa), float16 refused (no loss scaling), and every rank's RNG in the
checkpoint (trainer.dist.checkpoint)."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from sao_harness.trainer.modeling.models import PACKED_SDPA, policy_token_logprobs, use_packed_sdpa

# --- 1. sliding-window attention on packed rows ---------------------------------------------------

WINDOW, LENGTHS = 4, (11, 3, 14, 7)  # windows shorter and longer than trajectories


def windowed_qwen3(**overrides):
    """A tiny Qwen3 with a sliding window on layers >= max_window_layers (layer 0 full, 1 and 2 windowed)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(**{"vocab_size": 256, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
                            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
                            "use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1,
                            "attn_implementation": "sdpa"} | overrides)
    return Qwen3ForCausalLM(config).eval()


def hf_logprobs(model, ids: torch.Tensor) -> torch.Tensor:
    """log p(ids[t] | ids[:t]) for t >= 1 from the model's own forward on the trajectory alone."""
    logits = model(input_ids=ids[None]).logits[0, :-1].double()
    return logits.log_softmax(-1).gather(-1, ids[1:, None]).squeeze(-1)


def packed(trajectories: list[torch.Tensor]):
    """One packed row: input_ids [1, L], position ids restarting at 0, every non-first token an action."""
    ids = torch.cat(trajectories)[None]
    positions = torch.cat([torch.arange(len(t)) for t in trajectories])[None]
    return ids, positions, positions > 0


def test_the_windowed_config_really_differs_from_full_attention():
    """The reference honours the window: without it the logprobs move by far more than the tolerance."""
    ids = torch.randint(0, 256, (20,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        windowed, full = hf_logprobs(windowed_qwen3(), ids), hf_logprobs(windowed_qwen3(use_sliding_window=False), ids)
    assert windowed_qwen3().config.layer_types == ["full_attention", "sliding_attention", "sliding_attention"]
    assert (windowed - full).abs().max() > 1e-2


def test_packed_sdpa_honours_the_sliding_window_of_each_layer():
    """Packed rows on PACKED_SDPA give every trajectory's logprobs of transformers' own unpacked forward."""
    gen = torch.Generator().manual_seed(2)
    trajectories = [torch.randint(0, 256, (n,), generator=gen) for n in LENGTHS]
    ref_model, model = windowed_qwen3(), use_packed_sdpa(windowed_qwen3())
    assert model.config._attn_implementation == PACKED_SDPA
    ids, positions, actions = packed(trajectories)
    with torch.no_grad():
        ref = torch.cat([hf_logprobs(ref_model, t) for t in trajectories])
        logp, _ = policy_token_logprobs(model, ids, None, actions, position_ids=positions)
        single, _ = policy_token_logprobs(model, trajectories[2][None], None,  # one unpacked row, no mask
                                          torch.arange(LENGTHS[2])[None] > 0)
    torch.testing.assert_close(logp[actions].double(), ref, rtol=0, atol=1e-5)
    torch.testing.assert_close(single[0, 1:].double(), hf_logprobs(ref_model, trajectories[2]), rtol=0, atol=1e-5)



@pytest.mark.parametrize("window", [1, 3, 7, 49, 60])
@pytest.mark.parametrize("block", [1, 5, 16, 1024])
def test_the_blocked_window_is_one_full_window_mask(window, block):
    """Query blocks over the keys their window reaches = SDPA with the whole [n, n] window mask (GQA too)."""
    from sao_harness.trainer.modeling.models import _causal_sdpa, _window_mask

    gen = torch.Generator().manual_seed(window)
    q, k, v = (torch.randn(1, h, 50, 8, dtype=torch.float64, generator=gen) for h in (4, 2, 2))
    mask = _window_mask(range(50), range(50), window, q.device)
    full = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                                            attn_mask=mask)
    torch.testing.assert_close(_causal_sdpa(q, k, v, window, 0.0, None, block=block), full, rtol=0, atol=1e-12)

# --- 2. float16 is refused: nothing scales the loss -------------------------------------------------

def test_model_dtype_float16_is_refused_at_config_validation():
    from sao_harness.core.config import ConfigError
    from sao_harness.sao.config import load_config

    with pytest.raises(ConfigError, match=r"model\.dtype: float16 .*bfloat16 or float32.*loss scal"):
        load_config(None, ["model.dtype=float16"])
    for dtype in ("bfloat16", "float32"):
        assert load_config(None, [f"model.dtype={dtype}"]).model.dtype == dtype


def test_the_trainers_autocast_refuses_float16():
    """SAOTrainer (dtype= or a policy loaded in fp16), the ranks and the warm starts all autocast here."""
    from sao_harness.trainer.modeling.precision import autocast

    with pytest.raises(ValueError, match="float16 is not supported by the trainer"):
        autocast(torch.device("cpu"), torch.float16)
    with autocast(torch.device("cpu"), torch.bfloat16):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16


# --- 3. every rank's RNG states in the checkpoint ---------------------------------------------------

def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # the CUDA generators too


def draw() -> list:
    """What a rank draws next from every generator the checkpoint holds."""
    out = [random.random(), float(np.random.rand()), *torch.rand(3).tolist()]
    if torch.cuda.is_available():
        out += torch.rand(3, device="cuda").tolist()
    return out


def test_rank_rng_files_restore_each_ranks_own_draws(tmp_path):
    from sao_harness.trainer.dist.checkpoint import rank_rng_file, restore_rank_rng, save_rank_rng

    expected = {}
    for rank in (0, 1):  # two ranks seeded differently, each saves, then draws
        seed_all(100 + rank)
        assert save_rank_rng(tmp_path, rank) == rank_rng_file(tmp_path, rank)
        expected[rank] = draw()
    assert expected[0] != expected[1]
    for rank in (1, 0):
        seed_all(999)  # whatever the process drew in between
        assert restore_rank_rng(tmp_path, rank)
        assert draw() == expected[rank]
    seed_all(5)
    untouched = draw()
    seed_all(5)
    assert not restore_rank_rng(tmp_path, 2)  # no file for it (more ranks than saved): the state is left alone
    assert draw() == untouched


CONFIG = {"lr": 1e-3, "critic_lr": 1e-3, "critic_warmup_steps": 0, "max_staleness": 100}


def _save_draw_resume_draw(rank, world_size, address, second_port, model_dir, run_dir):
    """One rank: build, seed per rank, a sharded checkpoint, draw (the uninterrupted run); then a fresh
    build resumed from that checkpoint, draw again (the resumed run)."""
    import torch.distributed as dist

    from sao_harness.trainer.config import TrainerConfig
    from sao_harness.trainer.dist import checkpoint, distributed

    def build(ckpt=None):
        return lambda dp: distributed.build_sharded(TrainerConfig(**CONFIG), str(model_dir), "float32", dp, ckpt)

    rt = distributed.RankTrainer(rank, world_size, address, build())
    seed_all(7)
    driver = checkpoint.rng_state()  # what trainer.run.ranks passes: the driver's states, for rng.pt
    seed_all(100 + rank)
    draw()  # the run so far
    where = [rt.save_checkpoint(run_dir, 1, state=rt.counters(), keep=2, rng=driver)]
    dist.broadcast_object_list(where, src=0)  # rank 0 has committed it
    uninterrupted = draw()
    rt.close()
    seed_all(999)  # a new process would start elsewhere
    resumed_rt = distributed.RankTrainer(rank, world_size, (address[0], second_port), build(where[0]))
    resumed = draw()
    resumed_rt.close()
    return {"uninterrupted": uninterrupted, "resumed": resumed, "ckpt": where[0], "driver": driver}


@pytest.mark.slow
def test_two_gloo_ranks_resume_their_own_rng_from_a_sharded_checkpoint(tiny_model_dir, tmp_path):
    from sao_harness.trainer.dist import distributed

    out = distributed.spawn(2, _save_draw_resume_draw, distributed.free_port(), tiny_model_dir, tmp_path)
    for rank in (0, 1):
        assert out[rank]["resumed"] == out[rank]["uninterrupted"], f"rank {rank}"
    assert out[0]["uninterrupted"] != out[1]["uninterrupted"]  # each rank's own, not rank 0's for all
    ckpt = out[0]["ckpt"]
    assert sorted(p.name for p in ckpt.glob("rng*.pt")) == ["rng-rank00000.pt", "rng-rank00001.pt", "rng.pt"]
    saved = torch.load(ckpt / "rng.pt", weights_only=False)  # the driver's, which the loop restores
    assert saved["python"] == out[0]["driver"]["python"]
    assert torch.equal(saved["torch"], out[0]["driver"]["torch"])
