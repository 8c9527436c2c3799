"""One decode-shape projection of SmolLM2-135M (576 -> 3072, its fused gate/up), four ways, side by side:
fp32 `torch.mm`, the bf16 oneDNN linear the fast runner uses where bf16 is fast, torch's dynamic int8
linear (fbgemm: per-channel int8 weights, activations quantized per call), and weight-only int8
(`_weight_int8pack_mm`, bf16 activations).

    .venv/bin/python benchmarks/int8_projection.py [--rows 64 256] [--repeats 20]

The four alternate inside every repeat, so the noise of a shared machine hits all alike. Reported per
row count: median, min and max microseconds of one call (10 calls timed per repeat), each side's
largest error against the fp32 product, and the ratio of medians to bf16 and to fp32. The question
it answers (issue 35): would int8 rollout weights pay on this CPU? The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings

import torch


def sides(rows: int, hidden: int = 576, out: int = 3072) -> tuple[torch.Tensor, dict]:
    torch.manual_seed(0)
    x, w = torch.randn(rows, hidden), torch.randn(out, hidden) * 0.02
    w_t, x_bf16 = w.t().contiguous(), x.bfloat16()
    w_mkldnn = torch.ops.mkldnn._reorder_linear_weight(w.bfloat16(), rows)
    scale = w.abs().amax(1) / 127  # (out,): symmetric per-channel
    with warnings.catch_warnings():  # torch 2.13 deprecates quantized tensors; the measurement says so
        warnings.simplefilter("ignore")
        q = torch.quantize_per_channel(w, scale.double(), torch.zeros(out, dtype=torch.long), 0, torch.qint8)
    packed = torch.ops.quantized.linear_prepack(q, None)
    w_int8 = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return x @ w.t(), {
        "fp32": lambda: torch.mm(x, w_t),
        "bf16": lambda: torch.ops.mkldnn._linear_pointwise(x_bf16, w_mkldnn, None, "none", [], ""),
        "int8 dynamic": lambda: torch.ops.quantized.linear_dynamic(x, packed, True),
        "int8 weight-only": lambda: torch.ops.aten._weight_int8pack_mm(x_bf16, w_int8, scale.bfloat16()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    result = {"threads": torch.get_num_threads(), "rows": {}}
    for rows in args.rows:
        reference, fns = sides(rows)
        errors = {name: float((fn().float() - reference).abs().max()) for name, fn in fns.items()}
        times: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(args.repeats):
            for name, fn in fns.items():
                started = time.perf_counter()
                for _ in range(10):
                    fn()
                times[name].append((time.perf_counter() - started) / 10 * 1e6)
        median = {name: statistics.median(v) for name, v in times.items()}
        result["rows"][rows] = {
            name: {
                "median_us": round(median[name], 1),
                "min_us": round(min(v), 1),
                "max_us": round(max(v), 1),
                "max_abs_error": round(errors[name], 4),
                "bf16_over_this": round(median["bf16"] / median[name], 2),
                "fp32_over_this": round(median["fp32"] / median[name], 2),
            }
            for name, v in times.items()
        }
        for name, row in result["rows"][rows].items():
            print(
                f"{rows:>4} rows  {name:<17} median {row['median_us']:>9.1f} us  [{row['min_us']:.1f}, {row['max_us']:.1f}]  "
                f"bf16/this {row['bf16_over_this']:.2f}  fp32/this {row['fp32_over_this']:.2f}  max error {row['max_abs_error']}"
            )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
