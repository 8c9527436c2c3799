"""Run an env's scripted oracle through the real env API and summarize how it did.

    run_oracle("arith", n=100, split="test", seed=0, difficulty=5)
    # {"env": "arith", "n": 100, "accuracy": 1.0, "tool_calls": 500, "tool_errors": 0, ...}

Every oracle turn goes through `env.step`, so this checks the env as much as the oracle: tool
parsing, tool execution, answer extraction and grading. When a task lists its solution steps
(`meta["steps"]` in arith, `meta["annotations"]` in gsm8k) each tool result is also compared with the expected value.
The CLI wires this to `agentic-rl envs oracle ENV --n N [--split test] [--seed S]`.
"""

from __future__ import annotations

from typing import Any

from agentic_rl.envs.answer import answers_match
from agentic_rl.envs.base import Env, Task, make_env
from agentic_rl.envs.tool_env import reference_step_values

MAX_FAILURES_LISTED = 10


def run_oracle(env_name: str, n: int | None = None, split: str = "train", seed: int = 0, **options: Any) -> dict[str, Any]:
    """Build env `env_name` with `options`, take `n` tasks of `split`, run the oracle on each."""
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


def run_oracle_episode(env: Env, task: Task) -> dict[str, Any]:
    """One episode of the oracle on `task`: correct, counts, and why it failed (or None)."""
    env.reset(task)
    expected = reference_step_values(task)
    results: list[str] = []
    actions = env.oracle_actions(task)
    result = None
    for position, action in enumerate(actions):
        result = env.step(action)
        if result.done:
            if position != len(actions) - 1:
                return _episode(result.info, f"episode ended after {position + 1} of {len(actions)} oracle turns")
            break
        results += [message["content"] for message in result.observation or [] if message["role"] == "tool"]
    if result is None or not result.done:
        return {"correct": False, "tool_calls": 0, "tool_errors": 0, "turns": len(actions),
                "step_mismatches": 0, "failure": "oracle turns ran out before the episode ended"}
    mismatches = sum(1 for got, want in zip(results, expected) if not answers_match(got, want))
    episode = _episode(result.info, None if result.info["correct"] else
                       f"graded wrong: answered {result.info['final_answer']!r}, reference {task.answer!r}")
    episode["step_mismatches"] = mismatches
    if result.info["tool_errors"] and episode["failure"] is None:
        episode["failure"] = f"{result.info['tool_errors']} tool error(s)"
    return episode


def _episode(info: dict[str, Any], failure: str | None) -> dict[str, Any]:
    return {
        "correct": bool(info.get("correct")),
        "tool_calls": info.get("tool_calls", 0),
        "tool_errors": info.get("tool_errors", 0),
        "turns": info.get("turns", 0),
        "step_mismatches": 0,
        "failure": failure,
    }
