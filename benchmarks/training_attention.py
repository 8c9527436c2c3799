"""Forward + backward of one training micro-batch: transformers' sdpa against the trainers' attention.

    .venv/bin/python benchmarks/training_attention.py [--repeats 5] [--batch 8] [--precision bf16 fp32]

Model: the embedded SmolLM2-135M-Instruct with the default LoRA (r=16, all linear layers). The
micro-batches are `shared_prefix_training.py`'s: `--batch` oracle demonstrations of arith (sft; the
rows share the system prompt) and one GRPO group of `--batch` episodes of one problem (grpo; they
share the whole prompt, run once through the KV cache). Each side runs `sequence_logprobs` (what
every trainer calls), sums the log-probs over the loss mask and runs backward into the adapters:

* sdpa:     transformers' sdpa; under bf16 autocast the CPU flash kernel attends in bf16;
* ATTENTION: models/attention.py, which the trainers' models use: the same kernel in float32.

The sides alternate inside every repeat, so a shared machine's noise hits both alike. Reported per
micro-batch and precision: median, min and max seconds, the ratio of medians, and the largest
difference of the two sides' summed log-probs (fp32: 0, the same kernel on the same inputs). The
last line is JSON: {"sft/bf16": sdpa/ATTENTION, ...}.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
from shared_prefix_training import MODEL, micro_batches, step

from agentic_rl.algorithms.logprobs import sequence_logprobs
from agentic_rl.models import load_model
from agentic_rl.models.attention import ATTENTION
from agentic_rl.models.lora import LoraConfig, apply_lora

SIDES = ("sdpa", ATTENTION)


def summed_logprobs(model, batch, precision: str) -> float:
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        return float(sequence_logprobs(model, *batch)[0].sum())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--precision", nargs="+", default=["bf16", "fp32"], choices=["fp32", "bf16"])
    args = parser.parse_args()
    torch.manual_seed(0)
    causal_lm, tokenizer = load_model(MODEL)
    model = apply_lora(causal_lm, LoraConfig()).train()
    batches = micro_batches(tokenizer, args.batch)
    ratios = {}
    print(f"{MODEL}, LoRA, {args.batch} rows per micro-batch, threads {torch.get_num_threads()}, repeats {args.repeats}")
    print("| micro-batch | precision | tokens (rows x T) | sdpa s (min-max) | ATTENTION s (min-max) | ratio | max logp difference |")
    print("|---|---|---|---|---|---|---|")
    for name, batch in batches.items():
        for precision in args.precision:
            times: dict[str, list[float]] = {side: [] for side in SIDES}
            logps = {}
            for side in SIDES:  # warm-up, and each side's log-probs
                causal_lm.set_attn_implementation(side)
                step(model, batch, True, precision)
                logps[side] = summed_logprobs(model, batch, precision)
            for _ in range(args.repeats):
                for side in SIDES:
                    causal_lm.set_attn_implementation(side)
                    times[side].append(step(model, batch, True, precision))
            sdpa, ours = (statistics.median(times[side]) for side in SIDES)
            ratios[f"{name}/{precision}"] = round(sdpa / ours, 3)
            print(f"| {name} | {precision} | {batch[0].shape[0]} x {batch[0].shape[1]} | "
                  f"{sdpa:.2f} ({min(times['sdpa']):.2f}-{max(times['sdpa']):.2f}) | "
                  f"{ours:.2f} ({min(times[ATTENTION]):.2f}-{max(times[ATTENTION]):.2f}) | {sdpa / ours:.2f}x | "
                  f"{abs(logps['sdpa'] - logps[ATTENTION]):.3g} |", flush=True)
    print(json.dumps(ratios))


if __name__ == "__main__":
    main()
