"""The long-horizon test-bed (`trainer.env: chain`): long episodes whose reward is decided at a few turns.

An episode has T turns through the proxy (real generations, token-exact trace, exactly like
`trainer.env: toy`). The message before each turn is filler, n words drawn from a fixed list with
n ~ LogNormal(log(obs_words_median), obs_words_sigma) clipped to [obs_words_min, obs_words_max]
(tens to hundreds of tokens). Before the D = `decisions` decision turns it ends with "decide:" and the parity the reply
must have, "even" or "odd" repeated `repeat` times (`target`: "decision" draws one per decision,
"episode" one per episode). The first turn is always a decision, the other D - 1 are drawn among the
rest. The reward comes once, at the end:

    R = (1 / D) * sum_k 1[first token id of the reply at decision turn d_k has the parity named before it]

A decision turn with no reply (the episode ended before it) scores 0; the replies of the other
("filler") turns do not count. Online learning (`shift_every` = M, `sao paper`'s C8): the preference
flips every M policy versions, in phase k = v // M (v: the policy version of the episode's first sampled
token) the reward counts the parity opposite to the named one when k is odd, so what earned reward
before a shift costs it after, and the policy must re-learn while it trains.

Everything (T, the decision turns, the parities, the filler) is drawn from Random("chain:<draw>"), the
draw being `ctx.draw` (one per sync group, so that a GRPO group's G rollouts face the same episode as a
task's do; one per assignment in async) or else the episode id: an episode is a function of its draw
and of the sampled tokens.
Statuses and infra errors as in `harness.testbeds.simulated`.

Why each property:

- T = min(turns_max, floor(turns_min * X)), X ~ Pareto(turns_alpha) (P(X > x) = x^-alpha): at the
  defaults (8, 40, 2.0) the median is 11 turns and about 4% of the episodes run the full 40, so the
  lengths are heavy-tailed (max / median > 3) and a group barrier (`trainer.mode: sync`) waits on
  its longest episode while an asynchronous trainer need not.
- The first decision is at turn 0 and the reward arrives after turn T - 1: the credit for it must
  cross every later observation, hundreds to thousands of tokens, most of them filler.
- The filler turns' replies do not change R: a critic and an advantage that follow R must learn
  that they carry no credit, while the decision turns carry all of it.
- With `sampling.top_k: 16` (configs/learn-chain.yaml) each reply token is a choice among the model's
  16 best, about half of each parity: a random policy scores about 0.5 (both parities are named
  equally often, so whatever its bias), and the best reachable score is 1.0 (every decision reply of
  the named parity), which only a policy that reads the last observation reaches.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from sao_harness.harness.testbeds.simulated import chat_episode
from sao_harness.harness.trace import Trajectory

FILLER = ("log", "line", "file", "pass", "data", "item", "value", "run", "test", "read", "write", "path",
          "node", "key", "list", "map", "set", "call", "wait", "open", "close", "user", "time", "size")
BEST_SCORE = 1.0  # every decision reply of the named parity


@dataclass(frozen=True)
class ChainPlan:
    """One episode's draw: `turns`; `messages[t]`, the user message before turn t; `decisions`, the
    turns whose reply counts, and `targets`, the parity named before each."""

    turns: int
    decisions: tuple[int, ...]
    targets: tuple[str, ...]
    messages: tuple[str, ...]


def episode_turns(rng: random.Random, turns_min: int, turns_max: int, alpha: float) -> int:
    """min(turns_max, floor(turns_min * X)), X ~ Pareto(alpha) >= 1."""
    return min(turns_max, math.floor(turns_min * rng.paretovariate(alpha)))


def plan(draw: str, chain) -> ChainPlan:
    """The episode's draw from Random("chain:<draw>") under `chain` (a `testbed.chain` section)."""
    rng = random.Random(f"chain:{draw}")
    turns = episode_turns(rng, chain.turns_min, chain.turns_max, chain.turns_alpha)
    decisions = (0, *sorted(rng.sample(range(1, turns), chain.decisions - 1)))
    if chain.target == "episode":
        targets = (rng.choice(["even", "odd"]),) * chain.decisions
    else:
        targets = tuple(rng.choice(["even", "odd"]) for _ in decisions)
    wanted = dict(zip(decisions, targets))
    messages = []
    for t in range(turns):
        n = round(rng.lognormvariate(math.log(chain.obs_words_median), chain.obs_words_sigma))
        n = max(chain.obs_words_min, min(chain.obs_words_max, n))
        words = [rng.choice(FILLER) for _ in range(n)]
        if t in wanted:
            words += ["decide:"] + [wanted[t]] * chain.repeat
        messages.append(" ".join(words))
    return ChainPlan(turns, decisions, targets, tuple(messages))


def action_firsts(traj: Trajectory) -> list[int | None]:
    """The first token id of each turn's reply (one action segment per proxy turn; None: an empty one)."""
    return [s.token_ids[0] if s.token_ids else None for s in traj.segments if s.kind == "action"]


def preference_phase(traj: Trajectory, shift_every: int | None) -> int:
    """k = v // shift_every, v the policy version of the first sampled token (0 without shifts or tokens)."""
    versions = [s.policy_version[0] for s in traj.segments if s.kind == "action" and s.policy_version]
    return versions[0] // shift_every if shift_every and versions else 0


def chain_reward(traj: Trajectory, p: ChainPlan, shift_every: int | None = None) -> float:
    """The fraction of the decision turns whose reply starts with a token of the named parity, or of the
    other one in an odd preference phase (module doc)."""
    firsts = action_firsts(traj)
    flipped = preference_phase(traj, shift_every) % 2 == 1
    hits = sum(t < len(firsts) and firsts[t] is not None and ((firsts[t] % 2 == 0) == (want == "even")) != flipped
               for t, want in zip(p.decisions, p.targets))
    return hits / len(p.decisions)


def run_chain_episode(task, ctx, episode_id: str) -> Trajectory:
    """One chain episode (same interface as `harness.testbeds.simulated.run_simulated_episode`)."""
    chain = ctx.cfg.testbed.chain
    p = plan(ctx.draw or episode_id, chain)
    messages: list[dict[str, Any]] = [{"role": "user", "content": p.messages[0]}]

    def observe(turn: int) -> str:
        return p.messages[turn + 1] if turn + 1 < p.turns else "done"

    return chat_episode(task, ctx, episode_id, messages, p.turns, observe,
                        lambda traj: chain_reward(traj, p, chain.shift_every), "chain", planned_turns=p.turns,
                        decisions=list(p.decisions), targets=list(p.targets))
