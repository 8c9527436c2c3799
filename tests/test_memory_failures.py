"""experiments/memory_failures.py sorts failed memory episodes by the first thing they got wrong.
Built on the selective oracle's real transcript of one held-out task, each mutated once."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from agentic_rl.envs.base import make_env
from agentic_rl.envs.oracle import play_oracle

EXPERIMENTS = Path(__file__).parents[1] / "experiments"
sys.path.insert(0, str(EXPERIMENTS))  # the script imports failed_episodes.py from its own folder, as when run
_SPEC = importlib.util.spec_from_file_location("memory_failures", EXPERIMENTS / "memory_failures.py")
memory_failures = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(memory_failures)
OPTIONS = {"facts": 2, "distractors": 2, "gap": 2, "window": 2}


def _oracle():
    env = make_env("memory", **OPTIONS)
    task = env.tasks("test", n=1, seed=0)[0]
    return task, [dict(m) for m in play_oracle(env, task).conversation]


def _assistant(messages, predicate):
    return next(i for i, m in enumerate(messages) if m["role"] == "assistant" and predicate(m["content"]))


def test_each_failure_is_sorted_by_the_first_thing_it_got_wrong():
    """Guards against a classifier that blames the answer for a fact never stored, or the recall for a
    misread value: the four categories on four one-change mutants of a right episode."""
    task, right = _oracle()
    keys, answers = task.meta["keys"], task.meta["answers"]
    with pytest.raises(SystemExit, match="counts it failed"):
        memory_failures.classify(task, right)  # the oracle's episode is right: not a failure

    unstored = [dict(m) for m in right]
    unstored[_assistant(unstored, lambda c: f'"{keys[1]}"' in c and "remember" in c)]["content"] = "Next."
    assert memory_failures.classify(task, unstored) == {"category": "not stored", "recalls": 2}

    twice = [dict(m) for m in right]
    twice[_assistant(twice, lambda c: "recall" in c and f'"{keys[1]}"' in c)]["content"] = twice[
        _assistant(twice, lambda c: "recall" in c and f'"{keys[0]}"' in c)
    ]["content"]
    assert memory_failures.classify(task, twice) == {"category": "wrong recall", "recalls": 2}

    misread = [dict(m) for m in right]
    misread[_assistant(misread, lambda c: "Final Answer" in c)]["content"] = f"Final Answer: {answers[1]}, {answers[0]}"
    assert answers[0] != answers[1], "the test needs two different values"
    assert memory_failures.classify(task, misread) == {"category": "misread", "recalls": 2}

    silent = [dict(m) for m in right]
    silent[_assistant(silent, lambda c: "Final Answer" in c)]["content"] = "Next."
    assert memory_failures.classify(task, silent)["category"] == "no answer"


def test_a_file_without_every_failure_is_refused(tmp_path, capsys, monkeypatch):
    """Guards against a table computed from the 3 transcripts an evaluation keeps by default."""
    path = tmp_path / "eval.json"
    path.write_text(
        json.dumps(
            {
                "env": "memory",
                "per_task": {"id": ["memory/test/0/0", "memory/test/0/1"], "greedy": [0, 0]},
                "failures": [],
            }
        )
    )
    monkeypatch.setattr(
        "sys.argv", ["memory_failures.py", str(path), *[f"--option={k}={v}" for k, v in OPTIONS.items()]]
    )
    with pytest.raises(SystemExit, match="0 transcripts kept of 2 failures"):
        memory_failures.main()
