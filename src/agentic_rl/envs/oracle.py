"""Run an env's scripted oracle through the real env API and summarize how it did.

    run_oracle("arith", n=100, split="test", seed=0, difficulty=5)
    # {"env": "arith", "n": 100, "accuracy": 1.0, "tool_calls": 500, "tool_errors": 0, ...}

Every oracle turn goes through `env.step`, so this checks the env as much as the oracle: tool
parsing, tool execution, answer extraction and grading. When a task lists its solution steps
(`meta["steps"]` in arith, `meta["annotations"]` in gsm8k) each tool result is also compared with the expected value.
The CLI wires this to `agentic-rl envs oracle ENV [--n N] [--split train|test] [--seed S] [--option KEY=VALUE]`.

`play_oracle(env, task)` is the one loop that plays an oracle episode; SFT's `oracle_demos`
(rollout/demos.py) turns its conversation into a demonstration.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from agentic_rl.envs.answer import answers_match
from agentic_rl.envs.base import Env, StepResult, Task, episode_info, has_oracle, make_env, no_oracle_error
from agentic_rl.envs.tool_env import reference_step_values

MAX_FAILURES_LISTED = 10


def run_oracle(
    env_name: str, n: int | None = None, split: str = "train", seed: int = 0, **options: Any
) -> dict[str, Any]:
    """Build env `env_name` with `options`, take `n` tasks of `split`, run the oracle on each."""
    if has_oracle(env_name) is False:
        raise no_oracle_error(env_name, "envs oracle", "check it with `agentic-rl eval` on a model instead")
    env = make_env(env_name, **options)
    summary = run_oracle_episodes(env, env.tasks(split, n=n, seed=seed))
    return {"env": env_name, "split": split, "seed": seed, **summary}


def run_oracle_episodes(env: Env, tasks: list[Task]) -> dict[str, Any]:
    """Feed each task's oracle actions through `env.step`; totals and the first failures.

    Returns accuracy, n, tool_calls, tool_errors, mean_turns, step_mismatches (tool results
    that differ from the task's expected step values) and failures (task id and reason).
    """
    totals = {"correct": 0, "tool_calls": 0, "tool_errors": 0, "turns": 0, "step_mismatches": 0}
    failures: list[dict[str, Any]] = []
    for task in tasks:
        episode = run_oracle_episode(env, task)
        for key in totals:
            totals[key] += episode[key]
        if episode["failure"] and len(failures) < MAX_FAILURES_LISTED:
            failures.append({"task": task.id, "reason": episode["failure"]})
    n = len(tasks)
    return {
        "n": n,
        "accuracy": totals["correct"] / n if n else 0.0,
        "tool_calls": totals["tool_calls"],
        "tool_errors": totals["tool_errors"],
        "mean_turns": totals["turns"] / n if n else 0.0,
        "step_mismatches": totals["step_mismatches"],
        "failures": failures,
    }


@dataclasses.dataclass
class OracleEpisode:
    """One episode of an env's scripted oracle, played through `env.reset` and `env.step`."""

    conversation: list[dict[str, Any]]
    """The reset messages, then each oracle turn as an assistant message followed by the
    observation it got (none after the turn that ended the episode)."""
    result: StepResult | None
    """The last `env.step` result; None when the oracle had no turns."""
    tool_results: list[str]
    """The content of every tool message the env returned, in order."""
    turns_played: int
    """How many oracle turns went through `env.step`."""
    turns_planned: int
    """How many turns the oracle had; more than `turns_played` when the episode ended early."""
    sequences: list[list[dict[str, Any]]] = dataclasses.field(default_factory=list)
    """The conversation as the policy saw it, one list per token sequence: [conversation] for a
    prefix episode; a new list from each `StepResult.context` on (see Trajectory.previous)."""
    sequence_prompts: list[int] = dataclasses.field(default_factory=list)
    """How many leading messages of each sequence are its prompt (the reset messages, or the context)."""
    rewards: list[float] = dataclasses.field(default_factory=list)
    """Each played turn's step reward r_t, in order."""


def play_oracle(env: Env, task: Task) -> OracleEpisode:
    """Run `env.oracle_actions(task)` through `env.reset(task)` and `env.step` until done.

    The one oracle loop: `run_oracle_episode` grades it here, and SFT's `oracle_demos`
    (rollout/demos.py) turns its conversation into a trajectory."""
    conversation = list(env.reset(task))
    sequences, prompts = [list(conversation)], [len(conversation)]
    actions = env.oracle_actions(task)
    result = None
    tool_results: list[str] = []
    rewards: list[float] = []
    played = 0
    for action in actions:
        result = env.step(action)
        rewards.append(float(result.reward))
        played += 1
        conversation.append({"role": "assistant", "content": action})
        sequences[-1].append({"role": "assistant", "content": action})
        if result.done:
            break
        observation = result.observation or []
        conversation.extend(observation)
        if result.context is not None:
            sequences.append([dict(m) for m in result.context])
            prompts.append(len(result.context))
        else:
            sequences[-1].extend(observation)
        tool_results += [message["content"] for message in observation if message["role"] == "tool"]
    return OracleEpisode(conversation, result, tool_results, played, len(actions), sequences, prompts, rewards)


def run_oracle_episode(env: Env, task: Task) -> dict[str, Any]:
    """One episode of the oracle on `task`: correct, counts, and why it failed (or None)."""
    episode = play_oracle(env, task)
    result = episode.result
    if result is None or not result.done:
        return {
            "correct": False,
            "tool_calls": 0,
            "tool_errors": 0,
            "turns": episode.turns_planned,
            "step_mismatches": 0,
            "failure": "oracle turns ran out before the episode ended",
        }
    if episode.turns_played < episode.turns_planned:
        return _episode(
            result.info, f"episode ended after {episode.turns_played} of {episode.turns_planned} oracle turns"
        )
    expected = reference_step_values(task)
    mismatches = sum(1 for got, want in zip(episode.tool_results, expected) if not answers_match(got, want))
    info = episode_info(result.info)
    if info["correct"]:
        failure = None
    elif env.final_answers:
        failure = f"graded wrong: answered {info['final_answer']!r}, reference {task.answer!r}"
    else:
        failure = f"not solved (finish {info['finish']!r})"
    summary = _episode(info, failure)
    summary["step_mismatches"] = mismatches
    if info["tool_errors"] and summary["failure"] is None:
        summary["failure"] = f"{info['tool_errors']} tool error(s)"
    return summary


def _episode(info: dict[str, Any], failure: str | None) -> dict[str, Any]:
    info = episode_info(info)
    return {
        "correct": bool(info["correct"]),
        "tool_calls": info["tool_calls"],
        "tool_errors": info["tool_errors"],
        "turns": info["turns"],
        "step_mismatches": 0,
        "failure": failure,
    }
