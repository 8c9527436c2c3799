"""Forward + backward of one training micro-batch: the shared prefix run once vs every row in full.

    .venv/bin/python benchmarks/shared_prefix_training.py [--repeats 5] [--batch 8] [--precision fp32 bf16]

Model: the embedded SmolLM2-135M-Instruct with the default LoRA (r=16, all linear layers).
Two real micro-batches of `--batch` arith episodes rendered by our chat format (system prompt
with the calculator schema, user question, tool calls and observations):

* sft:  oracle demonstrations of `--batch` different two-step problems; the rows share the
        system prompt and tool schemas only;
* grpo: one GRPO group: `--batch` episodes of the SAME problem (the oracle's demonstration with
        its final answer varied per row, so the rows differ after the prompt); they share the
        whole prompt.

Each side calls `sequence_logprobs` (the function every trainer uses) with share_prefix on or
off, sums the log-probs over the loss mask and runs backward into the adapters: exactly the
work of one micro-batch of SFT or GRPO. The two sides are interleaved per repeat (off, on, ...)
so that the noise of a shared machine hits both alike; reported: median, min and max seconds,
and the ratio of medians. The last line is JSON: {"sft/fp32": off/on, ...}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from agentic_rl.models.logprobs import sequence_logprobs
from agentic_rl.models.backbone import shared_prefix_length
from agentic_rl.envs.base import make_env
from agentic_rl.models import load_model
from agentic_rl.models.chat_format import ChatFormat
from agentic_rl.models.lora import LoraConfig, apply_lora
from agentic_rl.rollout.demos import oracle_demos
from agentic_rl.rollout.trajectory import collate

MODEL = "smollm2-135m-instruct"


def micro_batches(tokenizer, batch: int) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    env = make_env("arith", difficulty=2)
    chat = ChatFormat.for_tokenizer(tokenizer)
    demos = oracle_demos(env, env.tasks("train", n=batch, seed=0), chat)
    sft = collate(demos, tokenizer.pad_token_id)
    group = [oracle_demos(env, env.tasks("train", n=1, seed=1), chat)[0] for _ in range(batch)]
    for row, traj in enumerate(group):  # vary each row's last policy token so the rows differ after the prompt
        last = max(i for i, m in enumerate(traj.loss_mask) if m)
        traj.input_ids[last - 2] = tokenizer.convert_tokens_to_ids(str(row % 10))
    grpo = collate(group, tokenizer.pad_token_id)
    return {name: (b.input_ids, b.attention_mask, b.loss_mask) for name, b in (("sft", sft), ("grpo", grpo))}


def step(model, batch, share: bool, precision: str) -> float:
    started = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        logps, _ = sequence_logprobs(model, *batch, share_prefix=share)
        loss = -(logps * batch[2]).sum() / batch[2].sum()
    loss.backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--precision", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    args = parser.parse_args()
    torch.manual_seed(0)
    model, tokenizer = load_model(MODEL)
    model = apply_lora(model, LoraConfig()).train()
    batches = micro_batches(tokenizer, args.batch)
    ratios = {}
    print(
        f"{MODEL}, LoRA, {args.batch} rows per micro-batch, threads {torch.get_num_threads()}, repeats {args.repeats}"
    )
    print(
        "| micro-batch | precision | tokens (rows x T) | shared prefix P | full rows s (min-max) | shared prefix s (min-max) | ratio |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, batch in batches.items():
        prefix = shared_prefix_length(*batch)
        for precision in args.precision:
            step(model, batch, True, precision), step(model, batch, False, precision)  # warm-up
            times = {False: [], True: []}
            for _ in range(args.repeats):
                for share in (False, True):
                    times[share].append(step(model, batch, share, precision))
            off, on = statistics.median(times[False]), statistics.median(times[True])
            ratios[f"{name}/{precision}"] = round(off / on, 3)
            print(
                f"| {name} | {precision} | {batch[0].shape[0]} x {batch[0].shape[1]} | {prefix} | "
                f"{off:.2f} ({min(times[False]):.2f}-{max(times[False]):.2f}) | "
                f"{on:.2f} ({min(times[True]):.2f}-{max(times[True]):.2f}) | {off / on:.2f}x |",
                flush=True,
            )
    print(json.dumps(ratios))


if __name__ == "__main__":
    main()
