"""Scratch probe: FastRunner decode loop vs transformers `generate`, SmolLM2-135M-Instruct.

    .venv/bin/python benchmarks/decode_probe.py [--batches 8 32] [--repeats 3] [--new 64] [--no-bf16]
        [--linears auto mm mkldnn]

Both sides get the same batch of identical prompts (no padding), sample exactly `--new` tokens
(plain multinomial sampling at temperature 1; generate's config here has no top-k/top-p) and
include prefill. Runs are interleaved (generate, fast, ... per repeat) so that the noise of a
shared machine hits both sides alike; the table reports median/min/max seconds, tokens/s and the
ratio of medians. fp32 rows compare fp32 with fp32. The bf16 rows compare FastRunner in bf16
with generate on a bf16 copy of the model (equal precision), and are labelled as bf16.
`--linears` runs one FastRunner per projection backend (`FastRunner(linear=...)`: "mm" is
torch.mm on plain weight copies, "mkldnn" oneDNN on prepacked weights, "auto" the default), each
timed in the same interleaved rounds and reported against the same `generate` runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from agentic_rl.models import load_model
from agentic_rl.rollout.fast_runner import FastRunner

PROMPT = [
    {"role": "system", "content": "You are a helpful assistant that solves arithmetic word problems step by step."},
    {
        "role": "user",
        "content": "Tom has 48 apples. He gives half of them to Ann and then buys 7 more. How many apples does he have now?",
    },
]


def run_generate(model, input_ids: torch.Tensor, new: int) -> int:
    with torch.inference_mode():
        out = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=True,
            max_new_tokens=new,
            min_new_tokens=new,
        )
    return (out.shape[1] - input_ids.shape[1]) * out.shape[0]


def run_fast(runner: FastRunner, prompt: list[int], batch: int, new: int, greedy: bool = False) -> int:
    slots = [runner.alloc() for _ in range(batch)]
    try:
        logits = runner.forward(slots, [prompt] * batch)
        produced = 0
        for step in range(new):
            if greedy:
                nxt = logits.argmax(-1)
            else:
                nxt = torch.multinomial(torch.softmax(logits, dim=-1), 1)[:, 0]
            produced += batch
            if step + 1 == new:
                break
            logits = runner.forward(slots, [[t] for t in nxt.tolist()])
        return produced
    finally:
        for s in slots:
            runner.free(s)


def stats(times: list[float], tokens: int) -> dict:
    med = statistics.median(times)
    return {"median": med, "min": min(times), "max": max(times), "tok_s": tokens / med}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--no-bf16", action="store_true")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument(
        "--linears",
        nargs="+",
        default=["auto"],
        choices=["auto", "mm", "mkldnn"],
        help="FastRunner projection backends to time (one FastRunner each)",
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    model, tok = load_model("smollm2-135m-instruct")
    model.eval()
    prompt = tok.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True)
    if not isinstance(prompt, list):
        prompt = prompt["input_ids"]
    prompt = [int(t) for t in prompt]
    max_b = max(args.batches)
    max_len = len(prompt) + args.new + 8
    variants = [("fp32", "generate", model, None)]
    variants += [
        ("fp32", f"fast-{lin}", None, FastRunner(model, max_slots=max_b, max_len=max_len, linear=lin))
        for lin in args.linears
    ]
    if not args.no_bf16:
        model16, _ = load_model("smollm2-135m-instruct", dtype=torch.bfloat16)
        model16.eval()
        variants.append(("bf16", "generate", model16, None))
        variants += [
            (
                "bf16",
                f"fast-{lin}",
                None,
                FastRunner(model, max_slots=max_b, max_len=max_len, dtype=torch.bfloat16, linear=lin),
            )
            for lin in args.linears
        ]

    print(
        f"prompt {len(prompt)} tokens, {args.new} new tokens, threads {torch.get_num_threads()}, "
        f"repeats {args.repeats} (interleaved)"
    )
    rows = []
    for batch in args.batches:
        ids = torch.tensor([prompt] * batch)
        # warm-up (one short run each)
        for prec, kind, m, r in variants:
            run_generate(m, ids, 4) if kind == "generate" else run_fast(r, prompt, batch, 4)
        times: dict[tuple[str, str], list[float]] = {(p, k): [] for p, k, _, _ in variants}
        tokens = batch * args.new
        for rep in range(args.repeats):
            for prec, kind, m, r in variants:
                t0 = time.perf_counter()
                n = run_generate(m, ids, args.new) if kind == "generate" else run_fast(r, prompt, batch, args.new)
                times[(prec, kind)].append(time.perf_counter() - t0)
                assert n == tokens, (n, tokens)
        for prec, kind, _, _ in variants:
            if kind == "generate":
                continue
            g, f = stats(times[(prec, "generate")], tokens), stats(times[(prec, kind)], tokens)
            rows.append((batch, prec, kind, g, f, g["median"] / f["median"]))
            print(
                f"batch {batch:3d} {prec}: generate {g['median']:.2f}s [{g['min']:.2f}-{g['max']:.2f}] "
                f"{g['tok_s']:.0f} tok/s | {kind} {f['median']:.2f}s [{f['min']:.2f}-{f['max']:.2f}] "
                f"{f['tok_s']:.0f} tok/s | ratio {g['median'] / f['median']:.2f}x",
                flush=True,
            )

    print("\n| batch | precision | generate s (min-max) | tok/s | runner | s (min-max) | tok/s | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for batch, prec, kind, g, f, ratio in rows:
        print(
            f"| {batch} | {prec} | {g['median']:.2f} ({g['min']:.2f}-{g['max']:.2f}) | {g['tok_s']:.0f} | {kind} | "
            f"{f['median']:.2f} ({f['min']:.2f}-{f['max']:.2f}) | {f['tok_s']:.0f} | {ratio:.2f}x |"
        )


if __name__ == "__main__":
    main()
