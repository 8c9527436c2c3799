"""One AdamW step over SmolLM2-135M-Instruct's parameters: torch's fused kernel vs the default
multi-tensor (foreach) path, side by side.

    .venv/bin/python benchmarks/optimizer_step.py [--repeats 7]

Both optimizers hold the same fp32 parameters (full fine-tuning: all 134.5 M) and step on the
same random gradients; the two sides alternate per repeat so that the noise of a shared machine
hits both alike. After one warm-up step each (it allocates the moments), reported: median, min
and max seconds of `optimizer.step()`, and the ratio of medians. The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from agentic_rl.models import load_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.manual_seed(0)
    model, _ = load_model("smollm2-135m-instruct")
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    sides = {
        "foreach": torch.optim.AdamW(params, lr=1e-6, foreach=True),
        "fused": torch.optim.AdamW(params, lr=1e-6, fused=True),
    }
    times: dict[str, list[float]] = {name: [] for name in sides}
    for optimizer in sides.values():
        optimizer.step()  # warm-up: allocates exp_avg and exp_avg_sq
    for _ in range(args.repeats):
        for name, optimizer in sides.items():
            started = time.perf_counter()
            optimizer.step()
            times[name].append(time.perf_counter() - started)
    n = sum(p.numel() for p in params)
    print(f"AdamW step over {n / 1e6:.1f} M fp32 parameters, threads {torch.get_num_threads()}, repeats {args.repeats}")
    for name, values in times.items():
        print(f"{name:8s} {statistics.median(values):.3f} s ({min(values):.3f}-{max(values):.3f})")
    ratio = statistics.median(times["foreach"]) / statistics.median(times["fused"])
    print(json.dumps({"foreach_over_fused": round(ratio, 3)}))


if __name__ == "__main__":
    main()
