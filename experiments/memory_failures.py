"""Why memory episodes fail: each failed episode of an evaluation read from its transcript, and sorted.

    agentic-rl eval --model M --env memory --option facts=2 --option distractors=2 --option gap=2 \
        --option window=2 --n 100 ... --set failures_shown=100 --out evals/M.json
    python experiments/memory_failures.py evals/sft.json evals/grpo-0.json ... --option facts=2 \
        --option distractors=2 --option gap=2 --option window=2

An evaluation keeps the transcripts of its first `failures_shown` failures (3 by default); this needs
all of them, and says so if a file has fewer. The task is rebuilt from its id (split, seed, index)
with the evaluation's env options, and must ask the question the transcript shows. Each failure gets
the first of these that fits, in the order an episode needs them:

    no answer        no `Final Answer:` line (it read on, or its last turn was cut)
    not stored       an asked fact was never stored under its key with its value
    wrong recall     both were stored, but after the question it did not recall each asked key
                     (it recalled another key, or one key twice)
    misread          it recalled both asked values and answered something else

and the recalls per failure after the question (a right one asks for the two keys, once each).
"""

from __future__ import annotations

import argparse
import collections
import statistics

from agentic_rl.cli_flags import parse_options
from agentic_rl.envs.base import make_env
from agentic_rl.envs.memory import extract_values, normalise_key
from agentic_rl.tools.parse import parse_tool_calls
from failed_episodes import load_failures

CATEGORIES = ("no answer", "not stored", "wrong recall", "misread")


def classify(task, messages: list[dict]) -> dict:
    """The failure's category and its recalls after the question (module docstring)."""
    question = next(
        (i for i, m in enumerate(messages) if m["role"] == "user" and m["content"] == task.meta["question"]), None
    )
    if question is None:
        raise SystemExit(
            f"{task.id}: the transcript never asks the task's question; pass the evaluation's --option values"
        )
    keys, answers = [normalise_key(k) for k in task.meta["keys"]], [normalise_key(a) for a in task.meta["answers"]]
    stored, recalled = {}, []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        for call in parse_tool_calls(message["content"]):
            if call.name == "remember" and "key" in call.arguments:
                stored[normalise_key(str(call.arguments["key"]))] = normalise_key(str(call.arguments.get("value", "")))
            elif call.name == "recall" and "key" in call.arguments and index > question:
                recalled.append(normalise_key(str(call.arguments["key"])))
    final = next((extract_values(m["content"]) for m in reversed(messages) if m["role"] == "assistant"), None)
    if final is None:
        category = "no answer"
    elif any(stored.get(key) != answer for key, answer in zip(keys, answers)):
        category = "not stored"
    elif sorted(recalled) != sorted(keys):
        category = "wrong recall"
    elif final == answers:
        raise SystemExit(f"{task.id}: stored, recalled and answered {final}, yet the evaluation counts it failed")
    else:
        category = "misread"
    return {"category": category, "recalls": len(recalled)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="evaluation JSON files of memory, with every failure kept")
    parser.add_argument(
        "--option", action="append", default=[], metavar="KEY=VALUE", help="the evaluation's env options"
    )
    args = parser.parse_args()
    env = make_env("memory", **parse_options(args.option))
    print("| evaluation | solved | " + " | ".join(CATEGORIES) + " | recalls after the question, per failure |")
    print("|---" * (len(CATEGORIES) + 3) + "|")
    for path in args.files:
        run, by_id = load_failures(path, "memory", env)
        features = [classify(by_id[failure["task_id"]], failure["messages"]) for failure in run["failures"]]
        counts = collections.Counter(f["category"] for f in features)
        recalls = f"{statistics.mean(f['recalls'] for f in features):.1f}" if features else ""
        print(
            f"| {path} | {sum(run['per_task']['greedy'])}/{len(run['per_task']['id'])} | "
            + " | ".join(str(counts[c]) for c in CATEGORIES)
            + f" | {recalls} |"
        )


if __name__ == "__main__":
    main()
