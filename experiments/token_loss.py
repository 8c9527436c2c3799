"""Where SFT's loss sits: teacher-forced NLL per kind of trained token, on oracle demonstrations.

    python experiments/token_loss.py --model runs/demo/sft/final --env arith --option difficulty=2 \
        --option 'templates=[shopping, baking, savings, sharing]' --n 100

Every trained (policy) token of `n` held-out oracle episodes is put in one class:

    operation   the first token after `Step k: ` (the oracle's Add / Subtract / Multiply by /
                Divide by): which operation the story asks for, the decision a word problem turns on
    number      a token with a digit in it (operands, copied results, the final answer)
    format      everything else (`Step`, the tool-call JSON, `Final Answer:`, the end of turn)

and the script prints, per class: tokens, the share of all trained tokens, the mean NLL, the share
of the summed loss, and the argmax accuracy. A loss that sits on a handful of operation tokens
while the format is learned says that more steps on the same tokens, not another format, is
what SFT needs (EXPERIMENTS.md, issue 31).
"""

from __future__ import annotations

import re
import time

import torch

from decisions import teacher_forced_inputs  # experiments/decisions.py: this script's folder is on sys.path

CLASSES = ("operation", "number", "format")
_STEP_PREFIX = re.compile(r"Step \d+:\s*")


def token_class(line_before: str, token_text: str) -> str:
    """The class of one trained token, from the text of its line before it and its own text."""
    if _STEP_PREFIX.fullmatch(line_before) and token_text.strip()[:1].isalpha():
        return "operation"
    return "number" if any(c.isdigit() for c in token_text) else "format"


def main() -> None:
    args, model, tokenizer, sequences = teacher_forced_inputs(__doc__.split("\n")[0], default_n=100)
    tokens = dict.fromkeys(CLASSES, 0)
    nll = dict.fromkeys(CLASSES, 0.0)
    right = dict.fromkeys(CLASSES, 0)
    start = time.perf_counter()
    for seq in sequences:
        ids = seq.input_ids
        logps = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)  # (T, V)
        for span in seq.policy_spans:
            for t in range(span.start, span.end):
                line_before = tokenizer.decode(ids[span.start : t]).split("\n")[-1]
                kind = token_class(line_before, tokenizer.decode([ids[t]]))
                tokens[kind] += 1
                nll[kind] -= float(logps[t - 1, ids[t]])
                right[kind] += int(logps[t - 1].argmax()) == ids[t]
    total_tokens, total_nll = sum(tokens.values()), sum(nll.values())
    print(
        f"{args.model}: {len(sequences)} sequences of {args.n} {args.split} oracle episodes in {time.perf_counter() - start:.0f} s; "
        f"mean NLL {total_nll / total_tokens:.4f} per trained token"
    )
    print(f"{'class':10s} {'tokens':>7s} {'share':>7s} {'mean NLL':>9s} {'loss share':>11s} {'argmax right':>13s}")
    for kind in CLASSES:
        count = max(1, tokens[kind])
        print(
            f"{kind:10s} {tokens[kind]:7d} {tokens[kind] / total_tokens:7.1%} {nll[kind] / count:9.4f} "
            f"{nll[kind] / max(total_nll, 1e-12):11.1%} {right[kind] / count:13.1%}"
        )


if __name__ == "__main__":
    main()
