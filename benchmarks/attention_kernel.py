"""The attention of one GRPO micro-batch, forward + backward: PyTorch's CPU kernels side by side.

    .venv/bin/python benchmarks/attention_kernel.py [--rows 4] [--queries 840] [--keys 1260] [--repeats 5]

The default shape is one micro-batch of plan's wide GRPO update (BENCHMARKS.md, "A GRPO update on
plan, op by op"): 4 rows (one group) whose ~1,260 tokens share a ~420-token prompt run once, so
~840 query positions per row attend over ~1,260 keys, through a causal mask offset by the prefix
(the boolean mask transformers' sdpa passes when a cache is present). SmolLM2-135M's shape: 9 query
heads of 64 over 3 key/value heads, repeated to 9 as transformers does for the CPU kernel.

Sides, the inputs made once per side and reused (gradients zeroed between passes):
  * flash bf16: `scaled_dot_product_attention` on bf16 q/k/v, what bf16 autocast runs;
  * flash fp32: the same kernel on float32 q/k/v (the 2026-12-04 candidate: upcast, autocast off);
  * math bf16: the unfused backend (matmul, softmax, matmul) on bf16 q/k/v.
They alternate inside every repeat after one warm-up round, so a noisy machine hits all alike.
Reported per side and per pass (forward, backward): median and range of seconds, and each side's
total over flash bf16's. The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SIDES = {
    "flash bf16": (SDPBackend.FLASH_ATTENTION, torch.bfloat16),
    "flash fp32": (SDPBackend.FLASH_ATTENTION, torch.float32),
    "math bf16": (SDPBackend.MATH, torch.bfloat16),
}


def inputs(rows: int, heads: int, queries: int, keys: int, head_dim: int, dtype: torch.dtype):
    """q (rows, heads, queries, head_dim), k and v (rows, heads, keys, head_dim), leaves that take
    gradients, and the bool mask (1, 1, queries, keys): query i sits at position keys - queries + i."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(rows, heads, length, head_dim, generator=generator).to(dtype).requires_grad_()
        for length in (queries, keys, keys)
    )
    positions = torch.arange(keys - queries, keys)[:, None]  # (queries, 1)
    mask = (torch.arange(keys)[None, :] <= positions)[None, None]  # (1, 1, queries, keys)
    return q, k, v, mask


def one_pass(backend: SDPBackend, q, k, v, mask) -> tuple[float, float]:
    """Seconds of the forward and of the backward of sum(attention output)."""
    with sdpa_kernel(backend):
        started = time.perf_counter()
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        forward = time.perf_counter() - started
        started = time.perf_counter()
        out.float().sum().backward()
        backward = time.perf_counter() - started
    for tensor in (q, k, v):
        tensor.grad = None
    return forward, backward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--queries", type=int, default=840)
    parser.add_argument("--keys", type=int, default=1260)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if not 0 < args.queries <= args.keys:
        parser.error(f"--queries {args.queries} must be in [1, --keys {args.keys}]")
    tensors = {
        side: inputs(args.rows, args.heads, args.queries, args.keys, args.head_dim, dtype)
        for side, (_, dtype) in SIDES.items()
    }
    times: dict[str, list[tuple[float, float]]] = {side: [] for side in SIDES}
    for round_ in range(1 + args.repeats):
        for side, (backend, _) in SIDES.items():
            spent = one_pass(backend, *tensors[side])
            if round_:
                times[side].append(spent)
    base = statistics.median(f + b for f, b in times["flash bf16"])
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}: {args.rows} rows x {args.heads} heads, "
        f"{args.queries} queries over {args.keys} keys, head dim {args.head_dim}; {args.repeats} rounds interleaved"
    )
    print("| side | forward s, median (min-max) | backward s, median (min-max) | total / flash bf16 |")
    print("|---|---|---|---|")
    summary = {}
    for side, spent in times.items():
        forward, backward = ([pass_[i] for pass_ in spent] for i in (0, 1))
        total = statistics.median(f + b for f, b in spent)
        summary[side] = {
            "forward_s": round(statistics.median(forward), 4),
            "backward_s": round(statistics.median(backward), 4),
            "ratio": round(total / base, 3),
        }
        print(
            f"| {side} | {statistics.median(forward):.3f} ({min(forward):.3f}-{max(forward):.3f}) | "
            f"{statistics.median(backward):.3f} ({min(backward):.3f}-{max(backward):.3f}) | {total / base:.2f} |"
        )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
