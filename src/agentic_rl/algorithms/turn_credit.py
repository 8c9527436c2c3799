"""Turn-level credit for GRPO (advantage.mode turn and turn_position): per-turn discounted
returns, their group baselines, and the values spread over each turn's tokens. Pure tensor code.

    episode     turn 0          turn 1          turn 2
    rewards     r_0             r_1             r_2 (+ the terminal reward)
    returns     G_0 = r_0 + γ G_1   G_1 = r_1 + γ G_2   G_2 = r_2
    advantage   (G_t − b_{g,t}) / s_g, on the tokens of turn t (`token_advantages_from_turns`)

With γ = 1 and only a terminal reward every turn's return is the episode's, and `turn_advantages`
with the "start" baseline is exactly `group_advantages` (algorithms/grpo.py).
"""

from __future__ import annotations

from typing import Literal, Sequence

import torch

from agentic_rl.algorithms.grpo import RewardScaling, _baseline_and_divisor, _exact_group_mean
from agentic_rl.algorithms.spans import spread_over_spans


def discounted_turn_returns(turn_rewards: Sequence[Sequence[float]], gamma: float) -> list[list[float]]:
    """Per-turn discounted returns G_t = sum_{k >= t} gamma^(k-t) r_k of each episode.

    Example: gamma = 0.9, rewards [0, 0, 1] -> [0.81, 0.9, 1.0].

    Args:
        turn_rewards: B lists, one reward per policy turn (ragged: episodes differ in turns).
        gamma: discount in [0, 1].
    Returns:
        B lists of the same lengths.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma={gamma} must be in [0, 1]")
    all_returns = []
    for rewards in turn_rewards:
        running, returns = 0.0, [0.0] * len(rewards)
        for turn in reversed(range(len(rewards))):
            running = rewards[turn] + gamma * running
            returns[turn] = running
        all_returns.append(returns)
    return all_returns


TurnBaseline = Literal["start", "position"]
TURN_BASELINES: tuple[str, ...] = ("start", "position")


def turn_advantages(
    turn_returns: Sequence[Sequence[float]],
    group_size: int,
    scale: RewardScaling = "group",
    eps: float = 1e-4,
    baseline: TurnBaseline = "start",
) -> list[list[float]]:
    """Per-turn advantages A_{i,t} = (G_{i,t} - b_{g,t}) / s_g from per-turn returns.

    s_g is the scale of the EPISODE returns G_{j,0} of i's group, as in `group_advantages`: their
    unbiased std + eps ("group"), the batch's ("batch"), or 1 ("none", or a group whose episode
    returns are all equal: it has no std, and eps alone would blow its per-turn differences up
    10^4-fold). The baseline b_{g,t}:

      * baseline="start" (advantage.mode turn): b_g, the group mean of the episode returns G_{j,0},
        the same for every turn. b_g estimates V(s_0) of the shared prompt, so the estimator is
        unbiased in expectation (up to the sample's own share in the mean, as in plain GRPO), but
        it compares a return from s_t with a return from s_0. With per-step rewards or gamma < 1
        that difference is not credit: with plan's -0.05 step cost discounted by 0.95, a group of
        one 9-turn success and seven 20-turn failures gives the failures' last turns A = +1.53
        (their remaining cost is small) and their first turns A = -0.35 (tested). Ragged groups make it worse:
        turn 15 exists only in long episodes, and is still compared with the start. With
        gamma = 1 and a terminal reward, G_{i,t} = G_{i,0} and this is EXACTLY `group_advantages`
        on every turn (tested).
      * baseline="position" (advantage.mode turn_position): b_{g,t} = the group mean of G_{j,t},
        the returns-to-go at the same turn index, where an episode that has ended counts 0 from
        its end on (the MDP's absorbing state earns nothing). A time-dependent baseline: it does
        not depend on the action at t, so the estimator stays unbiased in the same sense, and
        every turn index that any episode reaches has a baseline from all G episodes (none is
        left with its own return as the baseline and advantage 0). Equal returns-to-go at a
        turn index give exactly 0 there, so a group of identical episodes teaches nothing. Its
        own bias: turn t of a 2-turn and of a 5-turn episode are different states; at t >= 2
        the 5-turn episode is compared with the shorter one's 0. With gamma = 1 and a terminal
        reward it equals `group_advantages` where a group's episodes have equal turn counts; at
        t = 0 it always equals baseline="start".

    Args:
        turn_returns: B ragged lists (from `discounted_turn_returns`); each needs >= 1 turn.
        group_size: G. scale, eps: as in `group_advantages`.
        baseline: "start" or "position", above.
    Returns:
        B ragged lists of floats.
    """
    if baseline not in TURN_BASELINES:
        raise ValueError(f"baseline={baseline!r} is not one of {TURN_BASELINES}")
    if any(len(returns) == 0 for returns in turn_returns):
        raise ValueError("every episode needs at least one policy turn to have a return G_0")
    episode_returns = torch.tensor([returns[0] for returns in turn_returns], dtype=torch.float64)  # (B,)
    start, divisor = _baseline_and_divisor(episode_returns, group_size, scale, eps)  # (B,), (B,)
    longest = max(len(returns) for returns in turn_returns)
    if baseline == "start":
        per_turn = start[:, None].expand(-1, longest)  # (B, L)
    else:
        padded = torch.zeros(len(turn_returns), longest, dtype=torch.float64)  # (B, L): 0 after an episode ends
        for row, returns in enumerate(turn_returns):
            padded[row, : len(returns)] = torch.tensor(returns, dtype=torch.float64)
        _, mean = _exact_group_mean(padded.view(-1, group_size, longest))  # (P, L)
        per_turn = mean.repeat_interleave(group_size, dim=0)  # (B, L)
    return [
        [(value - float(per_turn[row, t])) / float(divisor[row]) for t, value in enumerate(returns)]
        for row, returns in enumerate(turn_returns)
    ]


def token_advantages_from_turns(
    turn_values: Sequence[Sequence[float]], turn_spans: Sequence[Sequence[object]], num_tokens: int
) -> torch.Tensor:
    """Spread one value per policy turn over that turn's tokens -> (B, T), 0 elsewhere.

    Args:
        turn_values: B ragged lists, one value per policy turn (e.g. from `turn_advantages`); an
            empty list leaves its row 0.
        turn_spans: B lists of the policy turns' half-open token ranges, as (start, end) tuples or
            objects with .start/.end (`Trajectory.policy_spans`); same lengths as turn_values.
        num_tokens: T, the padded length of the batch.
    Returns:
        (B, T) float32, to pass as `advantages` to `grpo_loss` (mask 0 positions are ignored there).
    """
    return spread_over_spans(turn_values, turn_spans, num_tokens, on="every")  # (B, T)
