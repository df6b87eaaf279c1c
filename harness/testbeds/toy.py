"""The learning test-bed (`trainer.env: toy`): a multi-turn env the tiny model can learn in minutes.

An episode has `testbed.toy.turns` turns through the proxy (real generations, token-exact trace,
exactly like `trainer.env: simulated`). The user message and each observation between turns name the
target of the next reply, "even" or "odd", the word repeated `repeat` times so that it makes up
much of the context (`target`: "episode" draws one parity per episode, "turn" one per turn,
seeded by the episode id; "even" always names even). The episode's stake s is drawn with it:
"low" (s = 1 - stakes) or "high" (s = 1 + stakes), the word repeated `repeat` times at the start
of the first user message (stakes = 0: s = 1, no stake words). The reward comes once, at the end:

    R = s * (1 / turns) * sum_t 1[first token id of reply t has the parity named before turn t]

so it depends on the actions of every turn, and the credit for turn t must cross the observations
after it. A turn with no reply token scores 0. Statuses and infra errors as in `harness.testbeds.simulated`.

With `sampling.top_k: 16` (configs/learn-toy.yaml) each reply token is a choice among the
model's 16 best tokens, about half of them of each parity: a random policy scores about 0.5 (E[s]
= 1), and a trainer that works pushes the right-parity tokens up within tens of steps. With a
drawn target a random policy scores 0.5 in expectation whatever the model's bias, since both
parities are named equally often; the policy must read the observation to do better.

The stake is what keeps the critic honest: once the policy is near-perfect the turns hardly vary
any more, but R = s still does, and a critic that reads the stake from the first message predicts
it at every token (explained variance near 1), while one that does not explains nothing. Before
that the hits so far and the named parity are the predictable part.
"""
from __future__ import annotations

import random
from typing import Any

from sao_harness.harness.testbeds.simulated import chat_episode
from sao_harness.harness.trace import Trajectory


def targets(episode_id: str, turns: int, mode: str) -> list[str]:
    """The parity named before each turn: all "even", or drawn from Random(episode_id) once per
    episode ("episode") or once per turn ("turn")."""
    if mode == "even":
        return ["even"] * turns
    rng = random.Random(f"toy:{episode_id}")
    if mode == "episode":
        return [rng.choice(["even", "odd"])] * turns
    return [rng.choice(["even", "odd"]) for _ in range(turns)]


def stake(episode_id: str, spread: float) -> tuple[str, float]:
    """The episode's stake: ("", 1.0) when spread = 0, else "low" / "high" (1 -/+ spread), drawn
    from its own Random(episode_id) stream (independent of the targets)."""
    if spread == 0:
        return "", 1.0
    word = random.Random(f"toy-stake:{episode_id}").choice(["low", "high"])
    return word, 1.0 - spread if word == "low" else 1.0 + spread


def turn_firsts(traj: Trajectory) -> list[int]:
    """The first token id of each turn's reply (one action segment per proxy turn)."""
    return [s.token_ids[0] for s in traj.segments if s.kind == "action" and s.token_ids]


def toy_reward(traj: Trajectory, wanted: list[str], scale: float = 1.0) -> float:
    """`scale` times the fraction of the planned turns whose reply starts with a token of the named parity."""
    firsts = turn_firsts(traj)
    hits = sum((tok % 2 == 0) == (want == "even") for tok, want in zip(firsts, wanted))
    return scale * hits / len(wanted)


def prompt(want: str, repeat: int, stake_word: str = "") -> str:
    words = [stake_word] * repeat if stake_word else []
    return " ".join(words + [want] * repeat)


def run_toy_episode(task, ctx, episode_id: str) -> Trajectory:
    """One toy episode (same interface as `harness.testbeds.simulated.run_simulated_episode`)."""
    toy = ctx.cfg.testbed.toy
    turns = toy.turns
    wanted = targets(episode_id, turns, toy.target)
    word, scale = stake(episode_id, toy.stakes)
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt(wanted[0], toy.repeat, word)}]

    def observe(turn: int) -> str:
        return prompt(wanted[turn + 1], toy.repeat) if turn + 1 < turns else "done"

    return chat_episode(task, ctx, episode_id, messages, turns, observe, lambda traj: toy_reward(traj, wanted, scale),
                        "toy", planned_turns=turns, targets=wanted, stake=scale)
