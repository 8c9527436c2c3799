"""How long are an env's episodes? Token counts of its oracle's episodes on a model's chat template.

    python experiments/episode_tokens.py --env plan --option difficulty=1 --option branching=1
    python experiments/episode_tokens.py --env memory --option facts=2 --option distractors=6 \
        --option gap=3 --option window=2 [--model smollm2-135m-instruct] [--n 40]

Over `n` train tasks (oracle episodes played through the env API, as SFT's demonstrations are),
medians and maxima of: the oracle's policy turns; the token sequences an episode trains as
(1 for a prefix episode; one per context change for an env with a window, such as memory);
the tokens summed over those sequences (what a training forward pass reads for the episode);
the tokens beyond the prefix every sequence of every episode shares (system prompt and tool
schemas, which training runs once per micro-batch: the real cost of a row); the longest sequence
(what bounds `rollout.max_episode_tokens`); and the policy tokens. Sizes
the settings of issue 37 (a GRPO step within ~60 s) before any model runs: tokens per episode
times episodes per step is what a step's forward and backward pass cost.
"""

from __future__ import annotations

import argparse
import statistics

from agentic_rl.cli_flags import parse_options
from agentic_rl.envs.base import make_env
from agentic_rl.models.chat_format import ChatFormat
from agentic_rl.models.loader import load_tokenizer
from agentic_rl.rollout.demos import oracle_demos


def _common_prefix(sequences: list[list[int]]) -> int:
    """Length of the token prefix all `sequences` share."""
    length = min(map(len, sequences))
    return next((i for i in range(length) if len({seq[i] for seq in sequences}) > 1), length)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", required=True)
    parser.add_argument("--option", action="append", metavar="KEY=VALUE", help="env option, repeatable")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--n", type=int, default=40)
    args = parser.parse_args()
    chat_format = ChatFormat.for_tokenizer(load_tokenizer(args.model), None)
    env = make_env(args.env, **parse_options(args.option))
    tasks = env.tasks("train", n=args.n, seed=0)
    episodes = [demo.sequences() for demo in oracle_demos(env, tasks, chat_format)]
    shared = _common_prefix([seq.input_ids for rows in episodes for seq in rows])
    columns = {
        "policy turns": [sum(1 for seq in rows for span in seq.spans if span.kind == "policy") for rows in episodes],
        "sequences": [len(rows) for rows in episodes],
        "tokens, all sequences": [sum(len(seq.input_ids) for seq in rows) for rows in episodes],
        f"beyond the {shared} shared": [sum(len(seq.input_ids) - shared for seq in rows) for rows in episodes],
        "longest sequence": [max(len(seq.input_ids) for seq in rows) for rows in episodes],
        "policy tokens": [sum(sum(seq.loss_mask) for seq in rows) for rows in episodes],
    }
    print(f"{args.env} {parse_options(args.option)}, {len(tasks)} train tasks, {args.model}:")
    for name, values in columns.items():
        print(f"  {name:<24} median {statistics.median(values):>7g}  max {max(values):>6}")


if __name__ == "__main__":
    main()
