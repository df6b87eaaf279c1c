"""The long-horizon test-bed (harness.testbeds.chain): the reward follows the decision turns only, the first
of them at turn 0; heavy-tailed episode lengths in [8, 40]; observations of tens to hundreds of tokens; an
oracle reaches the best score through the real proxy and a random policy (scripted, and the tiny model)
scores well below it."""
from __future__ import annotations

import random
import re
import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import AutoTokenizer

from sao_harness.harness.engines.scripted import ScriptedEngine
from sao_harness.harness.episode import EpisodeContext
from sao_harness.harness.proxy import ProxyServer
from sao_harness.harness.testbeds.chain import BEST_SCORE, chain_reward, plan, run_chain_episode
from sao_harness.harness.testbeds.config import ChainConfig
from sao_harness.harness.tiny_model import ensure_tiny_model
from sao_harness.harness.trace import Segment, Status, Trajectory
from sao_harness.sao.config import load_config
from sao_harness.trainer.config import TrainerConfig

CACHE = Path(__file__).resolve().parents[2] / ".cache" / "sao"
CHAIN = ChainConfig()
TASK = SimpleNamespace(instance_id="t-chain")
EPISODES = 6  # per policy through the proxy


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(ensure_tiny_model(CACHE, 0))


def parity_texts(tok) -> dict[str, str]:
    """A one-token reply text of each parity ("even": its token id is even)."""
    out = {}
    for word in ("a", "b", "c", "d", "x", "y"):
        (tid,) = tok.encode(word, add_special_tokens=False)
        out.setdefault("even" if tid % 2 == 0 else "odd", word)
    return out


class ChainPolicy(ScriptedEngine):
    """A scripted policy on the chain: "oracle" replies with the parity named by the last "decide:" of the
    prompt, "random" with a seeded coin; `wrong_at` (turns of the current episode, counted by `calls_in_episode`)
    get the other parity."""

    def __init__(self, tok, mode: str, wrong_at: tuple[int, ...] = ()):
        super().__init__(tok)
        self.mode, self.wrong_at, self.texts = mode, wrong_at, parity_texts(tok)
        self.rng, self.calls_in_episode = random.Random(0), 0

    def next_reply(self, prompt_ids: list[int]) -> str:
        named = re.findall(r"decide: (even|odd)", self.tokenizer.decode(prompt_ids))[-1]
        want = named if self.mode == "oracle" else self.rng.choice(["even", "odd"])
        if self.calls_in_episode in self.wrong_at:
            want = {"even": "odd", "odd": "even"}[want]
        self.calls_in_episode += 1
        return self.texts[want]


@pytest.fixture
def serve(tok):
    """``serve(engine) -> EpisodeContext`` of a proxy on 127.0.0.1 in front of `engine` (max_tokens 1)."""
    started = []

    def start(engine):
        cfg = load_config(None, [f"model.cache_dir={CACHE}", "sampling.max_tokens=1", "sampling.top_k=16",
                                 "trainer.env=chain"])
        proxy = ProxyServer(engine, engine.tokenizer, cfg, model_name="tiny")
        proxy.start(host="127.0.0.1")
        started.append(proxy)
        return EpisodeContext(cfg=cfg, proxy=proxy, run_id="run-chain")

    yield start
    for proxy in started:
        proxy.stop()


def episodes(ctx, engine, n: int = EPISODES) -> list[Trajectory]:
    out = []
    for i in range(n):
        if isinstance(engine, ChainPolicy):
            engine.calls_in_episode = 0
        out.append(run_chain_episode(TASK, ctx, f"chain-{i}"))
    return out


def test_the_reward_counts_the_decision_turns_only():
    p = plan("e1", CHAIN)
    assert p == plan("e1", CHAIN) and p.decisions[0] == 0 and len(p.decisions) == CHAIN.decisions
    wanted = dict(zip(p.decisions, p.targets))

    def traj(firsts):
        segs = []
        for tok in firsts:
            segs += [Segment("observation", [5, 6]), Segment("action", [tok], [-1.0], [0])]
        return Trajectory(task_id="t", segments=segs)

    best = [{"even": 2, "odd": 3}.get(wanted.get(t), 4) for t in range(p.turns)]
    assert chain_reward(traj(best), p) == BEST_SCORE == 1.0
    early = best.copy()
    early[0] += 1  # the first decision, turn 0: its credit crosses the whole episode
    assert chain_reward(traj(early), p) == pytest.approx(1 - 1 / CHAIN.decisions)
    filler = next(t for t in range(p.turns) if t not in wanted)
    changed = best.copy()
    changed[filler] += 1
    assert chain_reward(traj(changed), p) == 1.0
    assert chain_reward(traj(best[:p.decisions[-1]]), p) == pytest.approx(1 - 1 / CHAIN.decisions)  # never reached


def test_episode_lengths_are_heavy_tailed_in_8_to_40():
    turns = [plan(f"e{i}", CHAIN).turns for i in range(500)]
    assert min(turns) >= 8 and max(turns) == 40
    assert max(turns) / statistics.median(turns) >= 3
    targets = [t for i in range(200) for t in plan(f"e{i}", CHAIN).targets]
    assert 0.4 < targets.count("even") / len(targets) < 0.6  # both parities named about equally often


def test_observations_are_tens_to_hundreds_of_tokens(tok):
    lengths = [len(tok.encode(m)) for i in range(100) for m in plan(f"e{i}", CHAIN).messages]
    assert 8 <= min(lengths) < 50 and max(lengths) >= 200
    assert statistics.median(lengths) < 100


def test_the_config_is_checked():
    assert TrainerConfig(env="chain").env == "chain"
    with pytest.raises(ValueError, match="decisions=9 is above turns_min=8"):
        ChainConfig(decisions=9)
    with pytest.raises(ValueError, match="turns_min=50 is above turns_max=40"):
        ChainConfig(turns_min=50)


def test_an_oracle_reaches_the_best_score_through_the_proxy_and_a_random_policy_does_not(tok, serve):
    oracle = ChainPolicy(tok, "oracle")
    ctx = serve(oracle)
    trajs = episodes(ctx, oracle)
    for i, traj in enumerate(trajs):
        p = plan(f"chain-{i}", CHAIN)
        assert (traj.status, traj.turns, traj.reward) == (Status.OK, p.turns, BEST_SCORE), traj.metadata
        assert traj.metadata["decisions"] == list(p.decisions) and traj.metadata["env"] == "chain"
    obs = [len(s) for t in trajs for s in t.segments if s.kind == "observation"]
    assert min(obs) < 100 and max(obs) > 100

    wrong_early = ChainPolicy(tok, "oracle", wrong_at=(0,))
    rewards = [t.reward for t in episodes(serve(wrong_early), wrong_early)]
    assert rewards == [pytest.approx(1 - 1 / CHAIN.decisions)] * EPISODES
    fillers = tuple(t for t in range(CHAIN.turns_max) if t not in plan("chain-0", CHAIN).decisions)
    wrong_filler = ChainPolicy(tok, "oracle", wrong_at=fillers)
    assert episodes(serve(wrong_filler), wrong_filler, 1)[0].reward == BEST_SCORE

    coin = ChainPolicy(tok, "random")
    rewards = [t.reward for t in episodes(serve(coin), coin, 12)]
    assert statistics.mean(rewards) < 0.8 * BEST_SCORE


def test_the_tiny_model_untrained_scores_well_below_the_best(serve):
    from sao_harness.harness.engines.hf import HFEngine  # lazy: torch

    engine = HFEngine(str(ensure_tiny_model(CACHE, 0)), max_batch=2, timeout_s=60)
    try:
        trajs = episodes(serve(engine), engine)
    finally:
        engine.close()
    for i, traj in enumerate(trajs):
        p = plan(f"chain-{i}", CHAIN)
        actions = [s for s in traj.segments if s.kind == "action"]
        assert traj.status == Status.OK and traj.turns == len(actions) == p.turns, traj.metadata
        assert traj.reward in {k / CHAIN.decisions for k in range(CHAIN.decisions + 1)}
    assert statistics.mean(t.reward for t in trajs) < 0.9 * BEST_SCORE


def test_an_engine_failure_is_an_infra_error_without_reward(tok, serve):
    engine = ScriptedEngine(tok, ["a", "b"])  # the replies run out after two turns of at least eight
    traj = run_chain_episode(TASK, serve(engine), "chain-0")
    assert traj.status == Status.INFRA_ERROR and traj.reward is None and Status.INFRA_ERROR in traj.metadata


def test_the_preference_flips_every_shift_every_policy_versions():
    p = plan("e2", CHAIN)
    wanted = dict(zip(p.decisions, p.targets))

    def traj(version):
        firsts = [{"even": 2, "odd": 3}.get(wanted.get(t), 4) for t in range(p.turns)]
        segs = [s for tok in firsts for s in (Segment("observation", [5]), Segment("action", [tok], [-1.0], [version]))]
        return Trajectory(task_id="t", segments=segs)

    assert [chain_reward(traj(v), p) for v in (0, 9)] == [1.0, 1.0]  # no shifts: the named parity always
    assert [chain_reward(traj(v), p, shift_every=5) for v in (0, 4, 5, 9, 10)] == [1.0, 1.0, 0.0, 0.0, 1.0]
    with pytest.raises(ValueError):
        ChainConfig(shift_every=0)


def test_the_rollouts_of_a_sync_group_face_the_same_draw(tok, serve):
    from dataclasses import replace

    oracle = ChainPolicy(tok, "oracle")
    ctx = serve(oracle)
    group = [run_chain_episode(TASK, replace(ctx, draw="round-1:0"), f"g-{i}") for i in range(2)]
    other = run_chain_episode(TASK, replace(ctx, draw="round-1:1"), "g-2")
    same = plan("round-1:0", CHAIN)
    assert [t.metadata["decisions"] for t in group] == [list(same.decisions)] * 2
    assert [t.turns for t in group] == [same.turns] * 2 and group[0].token_ids == group[1].token_ids
    assert other.metadata["decisions"] == list(plan("round-1:1", CHAIN).decisions)
    assert other.token_ids != group[0].token_ids
