"""A roofline for this machine and the demo's phases: the peaks, each phase's work, and how near it runs.

    .venv/bin/python benchmarks/roofline.py                 # a few minutes; the last line is JSON
    .venv/bin/python benchmarks/roofline.py --repeats 9     # more samples per figure (median, range)

Run it alone on the machine: every figure is a rate, and anything beside it takes its share.

1. **Peaks.** GEMM rate at SmolLM2-135M's own shapes (q/o 576→576, k/v 576→192, gate/up 576→1536,
   down 1536→576, LM head 576→49,152), at 2,048 rows (training) and at the decode batch's rows, in
   float32 and (where this CPU has bf16 kernels: models/precision.py) bfloat16; memory read
   bandwidth (`x.sum()` over 512 MiB). A shape's rate is 2·M·K·N over its median time; the peak
   of a set of shapes is their total FLOPs over their total time (the mix a layer runs).
2. **Phases**, each at the demo's shapes (configs/demo.yaml), with the work it must do and the
   bound that work sets (the larger of FLOPs / GEMM peak and bytes / bandwidth):
   - decode: one FastRunner step for `--batch` rows (the demo's rollout batch, 32) holding
     `--context` cached tokens, of which the first `--shared-prefix` are one shared prefix (the
     system prompt and tool schemas; the engine prefills it once). FLOPs per row 2·P (P: the
     projection weights, the LM head included) + 4·L·H·ctx (attention: scores and values);
     bytes: every weight once, plus each row's K/V (the shared prefix once).
   - update: one forward and backward of the demo's LoRA policy (r 16 on every projection)
     through the toolkit's own `sequence_logprobs`, on `--update-rows` sequences of `--prompt`
     prompt tokens (one shared prefix, as GRPO's groups share it) and `--completion` trained
     tokens each. FLOPs over the T tokens the pass runs (the shared prefix once): forward
     2·P_body·T + 2·P_lora·T + attention A (4·L·H per causal pair), backward 2·P_body·T
     (activation gradients; frozen weights get none) + 4·P_lora·T + 2·A; the LM head 2·V·H each
     way on the trained tokens only. Bytes: the weights read twice (activations not counted: the
     pass is bound by FLOPs). An SFT step is the same pass on demonstrations.
   - evaluation is decoding at the evaluation's batch (`--eval-batch`, 64): the decode row again.
   Achieved rate = the work over the median time; fraction = bound time / measured time.

A phase's fraction is how much of the machine it uses; the gap to 1 is what the profile of each
phase (benchmarks/decode_floor.py, benchmarks/grpo_update_profile.py) splits by op.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Callable

import torch

from agentic_rl.models.logprobs import sequence_logprobs
from agentic_rl.models import load_model
from agentic_rl.models.lora import LoraConfig, apply_lora
from agentic_rl.models.precision import bf16_is_fast
from agentic_rl.rollout.fast_runner import FastRunner


def _median_range(run: Callable[[], Any], repeats: int) -> tuple[float, float, float]:
    """(median, min, max) seconds of `run()` after one warm-up call."""
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times), max(times)


def model_shapes(cfg: Any) -> dict[str, tuple[int, int]]:
    """(K, N) of each projection of one layer, and the LM head, as the model has them."""
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    hidden, kv = cfg.hidden_size, cfg.num_key_value_heads * head_dim
    return {
        "q": (hidden, hidden),
        "k": (hidden, kv),
        "v": (hidden, kv),
        "o": (hidden, hidden),
        "gate": (hidden, cfg.intermediate_size),
        "up": (hidden, cfg.intermediate_size),
        "down": (cfg.intermediate_size, hidden),
        "lm_head": (hidden, cfg.vocab_size),
    }


def gemm_peak(shapes: dict[str, tuple[int, int]], rows: int, dtype: torch.dtype, repeats: int) -> dict[str, Any]:
    """GFLOP/s of x (rows, K) @ W (K, N) for each shape, and of the whole layer mix (LM head apart)."""
    per_shape, layer_flops, layer_seconds = {}, 0.0, 0.0
    for name, (k, n) in shapes.items():
        x, w = torch.randn(rows, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        median, low, high = _median_range(lambda: x @ w, repeats)
        flops = 2.0 * rows * k * n
        per_shape[name] = {"gflops": flops / median / 1e9, "range": [flops / high / 1e9, flops / low / 1e9]}
        if name != "lm_head":
            layer_flops, layer_seconds = layer_flops + flops, layer_seconds + median
    return {"rows": rows, "layer_gflops": layer_flops / layer_seconds / 1e9, "shapes": per_shape}


def read_bandwidth(repeats: int) -> float:
    """GB/s of a sequential read of 512 MiB (`x.sum()` on every thread)."""
    x = torch.ones(128 * 1024 * 1024)
    median, _, _ = _median_range(lambda: x.sum(), repeats)
    return x.numel() * 4 / median / 1e9


def decode_phase(model: Any, batch: int, context: int, shared: int, dtype: torch.dtype, repeats: int) -> dict[str, Any]:
    """One FastRunner decode step for `batch` rows of `context` cached tokens (`shared` of them one prefix)."""
    steps = 8
    runner = FastRunner(model, max_slots=batch, max_len=context + steps * (repeats + 2) + 8, dtype=dtype)
    slots = [runner.alloc() for _ in range(batch)]
    prefix = [(7 * j) % 1000 + 1 for j in range(shared)]
    if shared:
        runner.forward(slots[:1], [prefix])
        for slot in slots[1:]:
            runner.fork(slots[0], slot, shared)
    runner.forward(slots, [[(11 * i + j) % 1000 + 1 for j in range(context - shared)] for i in range(batch)])
    step = [[5]] * batch

    def decode_steps() -> None:
        for _ in range(steps):
            runner.forward(slots, step)

    median, low, high = _median_range(decode_steps, repeats)
    cfg = model.config
    params = sum(
        k * n * (cfg.num_hidden_layers if name != "lm_head" else 1) for name, (k, n) in model_shapes(cfg).items()
    )
    ctx = context + steps * (repeats + 1.5)  # the mean cached length over the timed steps
    flops = batch * (2 * params + 4 * cfg.num_hidden_layers * cfg.hidden_size * ctx)
    item = torch.finfo(dtype).bits // 8
    kv_width = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * item
    read = params * item + kv_width * (shared + batch * (ctx - shared))
    return {
        "batch": batch,
        "context": context,
        "shared_prefix": shared,
        "step_s": median / steps,
        "step_range_s": [low / steps, high / steps],
        "tokens_per_s": batch * steps / median,
        "flops": flops,
        "bytes": read,
    }


def update_phase(model: Any, rows: int, prompt: int, completion: int, repeats: int) -> dict[str, Any]:
    """One forward and backward of `sequence_logprobs` on the LoRA policy: GRPO's update, SFT's step."""
    shared = [(7 * j) % 1000 + 1 for j in range(prompt)]
    input_ids = torch.tensor([shared + [(11 * i + j) % 1000 + 1 for j in range(completion)] for i in range(rows)])
    attention_mask = torch.ones_like(input_ids)
    loss_mask = torch.zeros_like(input_ids)
    loss_mask[:, prompt:] = 1

    def step() -> None:
        logps, _ = sequence_logprobs(model, input_ids, attention_mask, loss_mask)
        logps.sum().backward()
        model.zero_grad(set_to_none=True)

    median, low, high = _median_range(step, repeats)
    cfg = model.config
    shapes = model_shapes(cfg)
    body = sum(k * n for name, (k, n) in shapes.items() if name != "lm_head") * cfg.num_hidden_layers
    lora = sum(16 * (k + n) for name, (k, n) in shapes.items() if name != "lm_head") * cfg.num_hidden_layers
    tokens = prompt + rows * completion  # the shared prefix runs once
    trained = rows * completion
    attention = (
        4
        * cfg.num_hidden_layers
        * cfg.hidden_size
        * (prompt * prompt / 2 + rows * completion * (prompt + completion / 2))
    )
    head = cfg.vocab_size * cfg.hidden_size
    forward = 2 * body * tokens + 2 * lora * tokens + attention + 2 * head * trained
    backward = 2 * body * tokens + 4 * lora * tokens + 2 * attention + 2 * head * trained
    return {
        "rows": rows,
        "prompt": prompt,
        "completion": completion,
        "tokens": tokens,
        "step_s": median,
        "step_range_s": [low, high],
        "trained_tokens_per_s": trained / median,
        "flops": forward + backward,
        "bytes": 2 * (body + head) * 4,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32, help="decode rows: the demo's rollout batch")
    parser.add_argument("--eval-batch", type=int, default=64, help="decode rows of an evaluation")
    parser.add_argument("--context", type=int, default=448, help="cached tokens per row when a step is timed")
    parser.add_argument("--shared-prefix", type=int, default=376, help="of those, one prefix every row shares")
    parser.add_argument("--update-rows", type=int, default=8, help="sequences per update micro-batch")
    parser.add_argument("--prompt", type=int, default=430)
    parser.add_argument("--completion", type=int, default=180)
    args = parser.parse_args()

    torch.manual_seed(0)
    dtypes = [torch.float32] + ([torch.bfloat16] if bf16_is_fast() else [])
    model, _ = load_model("smollm2-135m-instruct")
    model.eval()
    shapes = model_shapes(model.config)
    bandwidth = read_bandwidth(args.repeats)
    peaks = {
        str(dtype).removeprefix("torch."): {
            rows: gemm_peak(shapes, rows, dtype, args.repeats) for rows in (2048, args.batch, args.eval_batch)
        }
        for dtype in dtypes
    }
    rows = []
    for dtype in dtypes:
        name = str(dtype).removeprefix("torch.")
        for label, batch in (("decode (GRPO rollouts)", args.batch), ("decode (evaluation)", args.eval_batch)):
            phase = decode_phase(model, batch, args.context, args.shared_prefix, dtype, args.repeats)
            peak = peaks[name][batch]["layer_gflops"] * 1e9
            bound = max(phase["flops"] / peak, phase["bytes"] / (bandwidth * 1e9))
            rows.append(
                {
                    "phase": label,
                    "dtype": name,
                    **phase,
                    "peak_gflops": peak / 1e9,
                    "bound_s": bound,
                    "achieved_gflops": phase["flops"] / phase["step_s"] / 1e9,
                    "fraction": bound / phase["step_s"],
                }
            )
    policy = apply_lora(model, LoraConfig())
    policy.train()
    update = update_phase(policy, args.update_rows, args.prompt, args.completion, args.repeats)
    peak = peaks["float32"][2048]["layer_gflops"] * 1e9
    bound = max(update["flops"] / peak, update["bytes"] / (bandwidth * 1e9))
    rows.append(
        {
            "phase": "update (GRPO, SFT): LoRA forward + backward",
            "dtype": "float32",
            **update,
            "peak_gflops": peak / 1e9,
            "bound_s": bound,
            "achieved_gflops": update["flops"] / update["step_s"] / 1e9,
            "fraction": bound / update["step_s"],
        }
    )

    print(f"threads {torch.get_num_threads()}; read bandwidth {bandwidth:.1f} GB/s")
    for name, by_rows in peaks.items():
        print(
            f"GEMM {name}: "
            + "; ".join(
                f"{r} rows {p['layer_gflops']:.0f} GFLOP/s (LM head {p['shapes']['lm_head']['gflops']:.0f})"
                for r, p in by_rows.items()
            )
        )
    print(f"{'phase':<46} {'dtype':<9} {'time [range]':>24} {'GFLOP/s':>8} {'bound':>9} {'fraction':>8}")
    for row in rows:
        low, high = row["step_range_s"]
        print(
            f"{row['phase']:<46} {row['dtype']:<9} {row['step_s'] * 1e3:>9.1f} ms [{low * 1e3:.1f}, {high * 1e3:.1f}] "
            f"{row['achieved_gflops']:>8.0f} {row['bound_s'] * 1e3:>6.1f} ms {row['fraction']:>8.2f}"
        )
    print(json.dumps({"threads": torch.get_num_threads(), "read_gbps": bandwidth, "peaks": peaks, "phases": rows}))


if __name__ == "__main__":
    main()
