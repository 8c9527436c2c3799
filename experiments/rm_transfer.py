"""Does a reward model's ranking carry to stories it never scored? Pairwise accuracy by story group.

    python experiments/rm_transfer.py --rm runs/rm/final --policy runs/demo/sft/final --n 48 --k 8 \
        --group seen 'shopping, baking, savings, sharing' --group new 'train, garden, warehouse'

For each group of arith story templates: `n` test-split tasks, `k` episodes of each sampled from
the policy (T = 1, the demo's limits), graded by the env; every (correct, incorrect) pair of a task
is scored by the reward model, and a pair counts as ranked right when the correct episode scores
higher. Reports per group the pairwise accuracy with a 95% CI from a bootstrap over tasks (pairs of
one task share its story and numbers, so they are not independent), the tasks with both outcomes,
and the pair count. 0.5 is chance; the RM's own held-out accuracy (`rm/heldout_accuracy`) is the
seen group's, measured on other tasks.
"""

from __future__ import annotations

import argparse
import collections
import random
import time

import torch

from agentic_rl.envs.base import EnvSpec
from agentic_rl.models.reward_scorer import load_trained_reward_model
from agentic_rl.rollout.config import RolloutConfig, Sampling
from agentic_rl.strict_json import write_json
from agentic_rl.training.reward_model import PairsConfig, build_pairs, pair_scores


def bootstrap_ci(per_task: list[tuple[int, int]], draws: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of sum(right) / sum(pairs), resampling tasks with replacement."""
    rng = random.Random(seed)
    values = []
    for _ in range(draws):
        sample = [per_task[rng.randrange(len(per_task))] for _ in per_task]
        values.append(sum(r for r, _ in sample) / max(1, sum(n for _, n in sample)))
    values.sort()
    return values[int(0.025 * draws)], values[int(0.975 * draws) - 1]


@torch.no_grad()
def score_pairs(scorer, tokenizer, pairs, batch: int = 8) -> list[bool]:
    """For each (chosen, rejected) pair: whether the reward model scores chosen above rejected."""
    right = []
    for start in range(0, len(pairs), batch):
        chosen, rejected = pair_scores(scorer, pairs[start : start + batch], tokenizer.pad_token_id)
        right.extend((chosen > rejected).tolist())
    return right


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rm", required=True, help="a reward model folder from `agentic-rl rm`")
    parser.add_argument("--policy", required=True, help="the model that samples the episodes")
    parser.add_argument(
        "--group",
        nargs=2,
        action="append",
        required=True,
        metavar=("LABEL", "TEMPLATES"),
        help="a label and a comma-separated list of arith templates (repeatable)",
    )
    parser.add_argument("--n", type=int, default=48, help="test-split tasks per group")
    parser.add_argument("--k", type=int, default=8, help="episodes sampled per task")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the table as JSON here")
    args = parser.parse_args()

    scorer, tokenizer = load_trained_reward_model(args.rm)
    rollout = RolloutConfig(max_turn_tokens=80, max_turns=5, sampling=Sampling(temperature=1.0), dtype="auto")
    rows = {}
    for label, templates in args.group:
        started = time.perf_counter()
        env = EnvSpec(name="arith", options={"difficulty": 2, "templates": [t.strip() for t in templates.split(",")]})
        cfg = PairsConfig(
            source="sampled",
            env=env,
            policy=args.policy,
            samples_per_task=args.k,
            max_pairs_per_task=args.k * args.k,
            rollout=rollout,
        )
        pairs = build_pairs(cfg, "test", args.n, tokenizer, args.seed)
        if not pairs:  # every task all right or all wrong: nothing to rank
            print(
                f"{label:>8}: no task of {args.n} had both a correct and an incorrect episode; raise --n or --k",
                flush=True,
            )
            rows[label] = {
                "pairwise_accuracy": None,
                "ci95": None,
                "pairs": 0,
                "tasks_with_both": 0,
                "tasks": args.n,
                "k": args.k,
            }
            continue
        right = score_pairs(scorer, tokenizer, pairs)
        by_task: dict[str, list[bool]] = collections.defaultdict(list)
        for (chosen, _), ok in zip(pairs, right):
            by_task[chosen.task_id].append(ok)
        per_task = [(sum(v), len(v)) for v in by_task.values()]
        accuracy = sum(right) / len(right)
        low, high = bootstrap_ci(per_task)
        rows[label] = {
            "pairwise_accuracy": accuracy,
            "ci95": [low, high],
            "pairs": len(pairs),
            "tasks_with_both": len(per_task),
            "tasks": args.n,
            "k": args.k,
            "seconds": round(time.perf_counter() - started, 1),
        }
        print(
            f"{label:>8}: {accuracy:.3f} [{low:.3f}, {high:.3f}]  {len(pairs)} pairs from {len(per_task)} of "
            f"{args.n} tasks with both outcomes  ({rows[label]['seconds']} s)",
            flush=True,
        )
    if args.out:
        write_json(args.out, {"rm": args.rm, "policy": args.policy, "seed": args.seed, "groups": rows})


if __name__ == "__main__":
    main()
