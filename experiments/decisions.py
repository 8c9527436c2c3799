"""Which decisions a model has learned: teacher-forced, on an env's oracle demonstrations.

    python experiments/decisions.py --model runs/memory/sft/final --env memory \
        --option facts=2 --option distractors=6 --option gap=3 --option window=2 --n 10

For every policy turn of every token sequence of `n` oracle episodes (held-out tasks by default),
the turn's kind (the tool it calls, `answer` for a final answer, else its text, e.g. `Next.`),
and under the model, given the oracle's context: whether the argmax first token is the oracle's,
the mean probability of the oracle's first token (the decision), and whether greedy decoding
would reproduce the whole turn token by token. A decision the model has not learned shows as a
low P(first) on one kind and a high one on the kind it is confused with.
"""

from __future__ import annotations

import argparse
import collections
import time

import torch

from agentic_rl.cli_flags import parse_options
from agentic_rl.envs.base import EnvSpec
from agentic_rl.models.chat_format import ChatFormat
from agentic_rl.models.stage_output import load_base_and_tokenizer
from agentic_rl.rollout.demos import demo_sequences, oracle_demos
from agentic_rl.tools.parse import parse_tool_calls


def turn_kind(text: str) -> str:
    calls = parse_tool_calls(text)
    if calls:
        return calls[0].name or "bad tool call"
    return "answer" if "final answer" in text.lower() else text.strip()[:20]


def teacher_forced_inputs(description: str, default_n: int):
    """Parse --model --env --option --n --split; return (args, model, tokenizer, the token
    sequences of n oracle episodes of that split). Shared with experiments/token_loss.py."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", required=True)
    parser.add_argument("--env", required=True)
    parser.add_argument("--option", action="append", default=[], help="env option key=value (repeatable)")
    parser.add_argument("--n", type=int, default=default_n, help="oracle episodes")
    parser.add_argument("--split", default="test")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    model, tokenizer, _ = load_base_and_tokenizer(args.model, "float32", "cpu")
    model.eval()
    env = EnvSpec(args.env, parse_options(args.option)).make()
    sequences = demo_sequences(
        oracle_demos(env, env.tasks(args.split, n=args.n, seed=0), ChatFormat.for_tokenizer(tokenizer))
    )
    return args, model, tokenizer, sequences


def main() -> None:
    args, model, tokenizer, sequences = teacher_forced_inputs(__doc__.split("\n")[0], default_n=10)
    stats: dict[str, list[float]] = collections.defaultdict(
        lambda: [0, 0, 0.0, 0]
    )  # turns, argmax right, Σ P, whole turn right
    start = time.perf_counter()
    for seq in sequences:
        logits = model(torch.tensor([seq.input_ids])).logits[0].float()
        predicted = logits.argmax(-1).tolist()
        for span in seq.policy_spans:
            target = seq.input_ids[span.start]
            row = stats[turn_kind(tokenizer.decode(seq.input_ids[span.start : span.end], skip_special_tokens=True))]
            row[0] += 1
            row[1] += predicted[span.start - 1] == target
            row[2] += float(torch.softmax(logits[span.start - 1], -1)[target])
            row[3] += predicted[span.start - 1 : span.end - 1] == seq.input_ids[span.start : span.end]
    print(
        f"{args.model}: {len(sequences)} sequences of {args.n} {args.split} oracle episodes in {time.perf_counter() - start:.0f} s"
    )
    print(f"{'turn':22s} {'turns':>5s} {'argmax first':>13s} {'mean P(first)':>14s} {'whole turn':>11s}")
    for kind, (turns, first, probability, whole) in sorted(stats.items()):
        print(f"{kind:22s} {turns:5d} {first / turns:13.1%} {probability / turns:14.3f} {whole / turns:11.1%}")


if __name__ == "__main__":
    main()
