"""The built-in reward terms (the seed's reward functions).

Compose them in a config; the total is Σ weight_i · term_i. The seed's formulas come out as
sums of terms:

    length-penalised accuracy   r = r_acc − α·max(0, l − l_target)  = accuracy + length_penalty
    step-rewarded accuracy      r = r_acc + β·min(s, cap)            = accuracy + step_bonus
"""

from __future__ import annotations

import re

from agentic_rl.rewards.base import register_reward
from agentic_rl.rollout.trajectory import Trajectory

_STEP_MARKER = re.compile(r"^\s*Step\s+\d+\s*:", re.MULTILINE | re.IGNORECASE)


def policy_text(traj: Trajectory) -> str:
    """All assistant turns of the episode, joined (decoded once by the engine, for rewards only)."""
    return "\n".join(m.get("content", "") for m in traj.messages if m.get("role") == "assistant")


@register_reward("accuracy")
def accuracy(traj: Trajectory) -> float:
    """1.0 if the environment graded the final answer correct, else 0.0."""
    return 1.0 if traj.info.get("correct") else 0.0


@register_reward("format")
def format_reward(traj: Trajectory) -> float:
    """1.0 if the episode ended with a parseable `Final Answer: <value>`, else 0.0."""
    return 1.0 if traj.info.get("format_ok") else 0.0


@register_reward("length_penalty")
def length_penalty(traj: Trajectory, alpha: float = 0.001, target: int = 256) -> float:
    """−α·max(0, l − target), l = the number of policy tokens in the episode.

    Args:
        alpha: Penalty per token beyond the target.
        target: Tokens allowed before the penalty starts.
    """
    return -alpha * max(0, traj.num_policy_tokens - target)


@register_reward("step_bonus")
def step_bonus(traj: Trajectory, beta: float = 0.05, cap: int = 5) -> float:
    """β·min(s, cap), s = the number of `Step k:` lines, paid ONLY when the answer is correct.

    Paying for steps on wrong answers would reward padding: the cheapest way to earn it is to
    write more `Step` lines, not to solve the problem. Gating on correctness means the bonus
    can only break ties between correct solutions in favour of shown work.

    Args:
        beta: Reward per step marker.
        cap: Most markers counted.
    """
    if not traj.info.get("correct"):
        return 0.0
    steps = len(_STEP_MARKER.findall(policy_text(traj)))
    return beta * min(steps, cap)


@register_reward("tool_use")
def tool_use(traj: Trajectory, no_calls: float = 0.0) -> float:
    """The share of tool calls that parsed and ran: (calls − errors) / calls.

    Args:
        no_calls: Value when the episode made no tool call.
    """
    calls = int(traj.info.get("tool_calls", 0))
    errors = int(traj.info.get("tool_errors", 0))
    if calls == 0:
        return no_calls
    return (calls - errors) / calls


@register_reward("solution_steps")
def solution_steps(traj: Trajectory) -> float:
    """The share of the reference solution's intermediate results that the episode's tool
    results reproduced, as an unbroken chain from the first: matched / total, in [0, 1].

    Partial credit for a right first step when the answer is wrong, so a GRPO group whose
    episodes all miss the answer can still rank them. The env computes the chain (see
    `envs/tool_env.py`); an env or task without reference steps gives 0.0.
    """
    total = traj.info.get("solution_steps_total", 0)
    return traj.info.get("solution_steps_matched", 0) / total if total else 0.0


@register_reward("env_steps")
def env_steps(traj: Trajectory, gamma: float = 1.0) -> float:
    """The discounted return of the environment's per-step rewards: Σ_t γ^t r_t.

    Args:
        gamma: Discount per policy turn.
    """
    return sum(gamma**t * r for t, r in enumerate(traj.turn_rewards))
