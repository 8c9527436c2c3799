"""Why plan episodes fail: each failed episode of an evaluation replayed through the env, and sorted.

    agentic-rl eval --model M --env plan --option difficulty=1 --option branching=1 --option max_turns=12 \
        --n 100 ... --set failures_shown=100 --out evals/M.json
    python experiments/plan_failures.py evals/sft.json evals/grpo-0.json ... --option difficulty=1 --option branching=1 \
        --option max_turns=12

An evaluation keeps the transcripts of its first `failures_shown` failures (3 by default); this needs
all of them, and says so if a file has fewer. Each failure's assistant turns are stepped through a
fresh env on the same house (rebuilt from the task id's split and seed, with the evaluation's env
options), and every tool observation must match the transcript's, so the replay is the episode.
Each failure gets the first of these that fits:

    gave up          a turn without a tool call ended it
    stuck            it repeated one refused action three or more times in a row
    no key needed    the oracle's optimal plan takes no key (a way round the locked door; with `branching`
                     about a quarter of the houses), and it failed anyway
    keys, no goal    it held every key the optimal plan takes and ran out of turns
    walked past      it had a turn in a room where a key it needed lay, and never took it
    never at a key   it never stood where a key it needed lay

and two numbers: the fewest actions the goal was ever away (the optimal plan's length from the state:
room, keys held), and refused actions per failure. The solved column splits the houses into those
whose optimal plan takes a key and those it does not.
"""

from __future__ import annotations

import argparse
import collections
import statistics

from agentic_rl.cli_flags import parse_options
from agentic_rl.envs.base import make_env
from agentic_rl.envs.plan import _world_of, shortest_plan
from failed_episodes import load_failures

CATEGORIES = ("gave up", "stuck", "no key needed", "keys, no goal", "walked past", "never at a key")


def replay(env, task, messages: list[dict]) -> dict:
    """Step the transcript's assistant turns through `env`; the episode's features (module docstring)."""
    env.reset(task)
    world, needed = env._world, {argument for action, argument in shortest_plan(env._world) if action == "take"}
    key_rooms = {room: colour for colour, room in world.keys if colour in needed}
    closest, refused, run, longest_run, last_refused, at_key = env._left, 0, 0, 0, None, False
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    info: dict = {}
    for position, index in enumerate(turns):
        room_before, held_before = env._room, set(env._held)
        if room_before in key_rooms and key_rooms[room_before] not in held_before:
            at_key = True
        result = env.step(messages[index]["content"])
        expected = [
            m["content"] for m in messages[index + 1 : turns[position + 1] if position + 1 < len(turns) else None]
        ]
        got = [m["content"] for m in result.observation or []]
        if result.observation is not None and got != expected:
            raise SystemExit(
                f"{task.id}: the replay's observation {got} differs from the transcript's {expected}; "
                "pass the evaluation's --option values"
            )
        errors = [m for m in result.observation or [] if m["content"].startswith("Error")]
        refused += len(errors)
        run = run + 1 if errors and messages[index]["content"] == last_refused else (1 if errors else 0)
        last_refused = messages[index]["content"] if errors else None
        longest_run = max(longest_run, run)
        closest = min(closest, env._left)
        info = result.info
    if not info or not result.done:
        raise SystemExit(f"{task.id}: the transcript ends before the episode does")
    if info["correct"]:
        raise SystemExit(f"{task.id}: the replay reaches the goal, but the evaluation counts it failed")
    if info["finish"] == "no_action":
        category = "gave up"
    elif longest_run >= 3:
        category = "stuck"
    elif not needed:
        category = "no key needed"
    elif needed <= env._held:
        category = "keys, no goal"
    else:
        category = "walked past" if at_key else "never at a key"
    return {"category": category, "closest": closest, "refused": refused, "optimal": task.meta["optimal_actions"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="evaluation JSON files of plan, with every failure kept")
    parser.add_argument(
        "--option", action="append", default=[], metavar="KEY=VALUE", help="the evaluation's env options"
    )
    args = parser.parse_args()
    options = parse_options(args.option)
    rows = []
    env = make_env("plan", **options)  # replay() resets it to each failure's house
    for path in args.files:
        run, by_id = load_failures(path, "plan", env)
        failed = len(run["per_task"]["id"]) - sum(run["per_task"]["greedy"])
        features = [replay(env, by_id[failure["task_id"]], failure["messages"]) for failure in run["failures"]]
        counts = collections.Counter(f["category"] for f in features)
        keyed = {
            task_id: any(action == "take" for action, _ in shortest_plan(_world_of(by_id[task_id])))
            for task_id in run["per_task"]["id"]
        }
        solved = dict(zip(run["per_task"]["id"], run["per_task"]["greedy"]))
        split_solved = [
            f"{sum(solved[i] for i in keyed if keyed[i] == want)}/{sum(v == want for v in keyed.values())}"
            for want in (True, False)
        ]
        rows.append(
            [
                path,
                f"{len(run['per_task']['id']) - failed}/{len(run['per_task']['id'])} "
                f"(key houses {split_solved[0]}, no-key {split_solved[1]})",
            ]
            + [str(counts[c]) for c in CATEGORIES]
            + [
                f"{statistics.mean(f['closest'] for f in features):.2f}" if features else "",
                f"{statistics.mean(f['refused'] for f in features):.1f}" if features else "",
            ]
        )
    print("| evaluation | solved | " + " | ".join(CATEGORIES) + " | closest to the goal (actions) | refused actions |")
    print("|---" * (len(CATEGORIES) + 4) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
