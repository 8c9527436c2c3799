"""How long are `plan` episodes? Token counts of the oracle's episodes on a model's chat template.

    python experiments/plan_tokens.py [--model smollm2-135m-instruct] [--n 40]

For each (difficulty, branching) of 1-2 x 0-1: over `n` train worlds, the optimal plan's actions
(median, max), the oracle episode's tokens (median, max: prompt, policy turns and observations)
and its policy tokens (median). Sizes the settings of issue 37 (a GRPO step within ~60 s).
"""

from __future__ import annotations

import argparse
import statistics

from agentic_rl.envs.base import make_env
from agentic_rl.models.chat_format import ChatFormat
from agentic_rl.models.loader import load_tokenizer
from agentic_rl.rollout.demos import oracle_demos


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--n", type=int, default=40)
    args = parser.parse_args()
    chat_format = ChatFormat.for_tokenizer(load_tokenizer(args.model), None)
    for difficulty in (1, 2):
        for branching in (0, 1):
            env = make_env("plan", difficulty=difficulty, branching=branching)
            tasks = env.tasks("train", n=args.n, seed=0)
            demos = list(oracle_demos(env, tasks, chat_format))
            actions = [task.meta["optimal_actions"] for task in tasks]
            tokens = [len(demo.input_ids) for demo in demos]
            policy = [sum(demo.loss_mask) for demo in demos]
            print(f"difficulty {difficulty} branching {branching}: actions median {statistics.median(actions)} max {max(actions)}; "
                  f"episode tokens median {statistics.median(tokens)} max {max(tokens)}; policy tokens median {statistics.median(policy)}")


if __name__ == "__main__":
    main()
