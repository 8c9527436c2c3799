"""Where one FastRunner decode step goes, against this machine's memory floor.

    .venv/bin/python benchmarks/decode_floor.py [--batch 8] [--context 448] [--steps 16] [--dtype bfloat16]
        [--shared-prefix 376]        # the agent layout: the rows share their first 376 cached tokens

1. Read bandwidth: median time of `x.sum()` over a 512 MiB fp32 tensor (sequential reads, all
   threads), in GB/s.
2. One decode step of the embedded SmolLM2-135M-Instruct in FastRunner: `--batch` rows that each
   hold `--context` cached tokens decode `--steps` tokens under torch.profiler; the op time per
   step is split into projections (mm/addmm/oneDNN linear), attention (SDPA) and everything else,
   and the wall time per step is reported next to it. With `--shared-prefix N` the rows' first N
   tokens are the same: prefilled once and forked into every slot, as the rollout engine does
   with an env's system prompt and tool schemas, so FastRunner attends them once per step.
3. The floor: the bytes a step must read (every projection weight once, the LM head included,
   plus the K/V cache of every row; a shared prefix once) divided by the bandwidth of (1).
The prefill of the rows (as the engine does it: the shared prefix once, then every row's own
tokens in one call) is timed once and reported too.

The last line is JSON with every number.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from agentic_rl.models import load_model
from agentic_rl.rollout.fast_runner import FastRunner

PROJECTION_OPS = ("aten::mm", "aten::addmm", "aten::addmm_", "mkldnn::_linear_pointwise")
ATTENTION_OPS = ("aten::_scaled_dot_product_flash_attention_for_cpu",)


def read_bandwidth(repeats: int = 9) -> float:
    x = torch.ones(128 * 1024 * 1024)  # 512 MiB
    x.sum()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        x.sum()
        times.append(time.perf_counter() - t)
    return x.numel() * 4 / statistics.median(times) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=448, help="cached tokens per row before decoding")
    ap.add_argument("--steps", type=int, default=16, help="profiled decode steps")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    ap.add_argument("--linear", choices=["auto", "mm", "mkldnn"], default="auto")
    ap.add_argument(
        "--shared-prefix",
        type=int,
        default=0,
        help="cached tokens every row shares (prefilled once and forked, as in the rollout engine)",
    )
    args = ap.parse_args()
    if not 0 <= args.shared_prefix < args.context:
        raise SystemExit(f"--shared-prefix must be in [0, --context), got {args.shared_prefix}")
    dtype = getattr(torch, args.dtype)

    gbps = read_bandwidth()
    model, _ = load_model("smollm2-135m-instruct")
    model.eval()
    runner = FastRunner(
        model, max_slots=args.batch, max_len=args.context + 2 * args.steps + 8, dtype=dtype, linear=args.linear
    )
    rows = [[(7 * i + j) % 1000 + 1 for j in range(args.context)] for i in range(args.batch)]
    shared = args.shared_prefix
    rows = [rows[0][:shared] + row[shared:] for row in rows]

    def prefill() -> list[int]:
        """The engine's prefill: a shared prefix once, forked into every slot, then each row's own tokens."""
        slots = [runner.alloc() for _ in range(args.batch)]
        if shared:
            runner.forward(slots[:1], [rows[0][:shared]])
            for slot in slots[1:]:
                runner.fork(slots[0], slot, shared)
        runner.forward(slots, [row[shared:] for row in rows])
        return slots

    for slot in prefill():  # warm-up: first-call allocation and kernel selection
        runner.free(slot)
    t = time.perf_counter()
    slots = prefill()
    prefill_ms = (time.perf_counter() - t) * 1e3
    step = [[5]] * args.batch
    for _ in range(3):
        runner.forward(slots, step)
    t = time.perf_counter()
    for _ in range(args.steps):
        runner.forward(slots, step)
    wall_ms = (time.perf_counter() - t) / args.steps * 1e3
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            runner.forward(slots, step)
    split = {"projections": 0.0, "attention": 0.0, "other": 0.0}
    for ev in prof.key_averages():
        kind = "projections" if ev.key in PROJECTION_OPS else "attention" if ev.key in ATTENTION_OPS else "other"
        split[kind] += ev.self_cpu_time_total / 1e3 / args.steps  # ms per step
    op_ms = sum(split.values())

    cfg = model.config
    item = torch.finfo(dtype).bits // 8
    per_layer = cfg.hidden_size * (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * runner.head_dim
    per_layer += cfg.hidden_size * cfg.num_attention_heads * runner.head_dim  # o_proj
    per_layer += 3 * cfg.hidden_size * cfg.intermediate_size  # gate, up, down
    weight_mb = (cfg.num_hidden_layers * per_layer + cfg.vocab_size * cfg.hidden_size) * item / 1e6
    ctx = args.context + 3 + args.steps * 3 // 2  # mean cached length over the profiled steps
    kv_tokens = shared + args.batch * (ctx - shared)  # a shared prefix is read once per step
    kv_mb = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * kv_tokens * runner.head_dim * item / 1e6
    floor_ms = (weight_mb + kv_mb) / 1e3 / gbps * 1e3
    proj_gbps = weight_mb / 1e3 / (split["projections"] / 1e3)

    print(
        f"read bandwidth {gbps:.1f} GB/s; {args.dtype}, linear={runner.linear}, batch {args.batch}, "
        f"context {args.context} (shared prefix {shared}, attended once: {runner.shared_prefix_calls > 0}), "
        f"threads {torch.get_num_threads()}; prefill {prefill_ms:.0f} ms"
    )
    print(
        f"decode step: {wall_ms:.1f} ms wall, {op_ms:.1f} ms op time = projections {split['projections']:.1f} "
        f"({weight_mb:.0f} MB of weights at {proj_gbps:.1f} GB/s) + attention {split['attention']:.1f} "
        f"(K/V {kv_mb:.0f} MB) + other {split['other']:.1f}"
    )
    print(
        f"memory floor: {weight_mb + kv_mb:.0f} MB / {gbps:.1f} GB/s = {floor_ms:.1f} ms per step "
        f"({wall_ms / floor_ms:.1f}x above it)"
    )
    print(
        json.dumps(
            {
                "read_gbps": gbps,
                "dtype": args.dtype,
                "linear": runner.linear,
                "batch": args.batch,
                "context": args.context,
                "shared_prefix": shared,
                "prefill_ms": prefill_ms,
                "wall_ms": wall_ms,
                "op_ms": op_ms,
                **{f"{k}_ms": v for k, v in split.items()},
                "weight_mb": weight_mb,
                "kv_mb": kv_mb,
                "projection_gbps": proj_gbps,
                "floor_ms": floor_ms,
            }
        )
    )


if __name__ == "__main__":
    main()
