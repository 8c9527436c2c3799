"""Where one real GRPO step's time goes: its rollout, and its update op by op.

    .venv/bin/python benchmarks/grpo_update_profile.py --config configs/experiments/plan-wide-grpo.yaml \
        --set model.name=runs/plan-short/sft/final [--set rollout.batch_size=16 ...] [--steps 1]

Runs `--steps` real steps of `agentic-rl grpo` (train_grpo, into a temporary folder) with the
given config and overrides. The forward/backward of every micro-batch runs under
`torch.profiler`; each micro-batch's shape is recorded from inside the loss: its rows, its width
after trimming, the prefix its rows share, the tokens its backbone runs (the prefix once plus each
row's rest) and the tokens it trains. Printed:

* the step's phases from its own metrics (rollout, forward/backward, optimizer);
* per micro-batch: shape, seconds, and backbone tokens per second;
* the update's self CPU time by op family (matrix products, attention, the LM head and its
  log-softmax, elementwise and normalisation, copies and dtype casts, the rest), and the 15 ops
  that cost most.

The profiler adds per-op overhead, so only the last step is profiled and every step's backbone
tokens per second are printed: the unprofiled steps give the speed, the profiled one the shares.
The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import defaultdict

import torch

from agentic_rl.config import load_config
from agentic_rl.models.backbone import shared_prefix_length
from agentic_rl.training import grpo as grpo_module
from agentic_rl.training.grpo_config import GRPOConfig
from agentic_rl.training.loop import Trainer

FAMILIES = [  # (family, substrings of the op name), first match wins
    ("attention", ("attention", "flash", "sdpa")),
    ("matrix products", ("mm", "matmul", "linear", "bmm", "addmm", "mkldnn")),
    ("LM head log-softmax", ("logsumexp", "softmax", "amax", "gather", "scatter", "exp")),
    ("copies and casts", ("copy_", "aten::to", "_to_copy", "contiguous", "clone", "cat", "index", "repeat", "expand")),
    (
        "elementwise and norms",
        (
            "mul",
            "add",
            "sub",
            "div",
            "pow",
            "rsqrt",
            "mean",
            "silu",
            "neg",
            "sum",
            "where",
            "fill",
            "zero",
            "sigmoid",
            "rms",
            "cos",
            "sin",
        ),
    ),
]


def family(name: str) -> str:
    low = name.lower()
    for label, keys in FAMILIES:
        if any(key in low for key in keys):
            return label
    return "rest"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    parser.add_argument("--steps", type=int, default=2, help="steps to run; the last one is profiled")
    args = parser.parse_args()

    out_dir = tempfile.mkdtemp(prefix="grpo-profile-")
    cfg = load_config(
        GRPOConfig,
        args.config,
        args.overrides
        + [
            f"train.steps={args.steps}",
            f"train.output_dir={out_dir}",
            "train.checkpoint_every=0",
            "train.progress=false",
        ],
    )
    shapes: dict[int, list[dict[str, float]]] = defaultdict(list)  # step -> its micro-batches
    state = {"step": 0, "profile": None}
    loss_of, accumulate = grpo_module.GRPO.loss, Trainer.accumulate

    def recorded_loss(self, model, micro):
        started = time.perf_counter()
        loss, metrics = loss_of(self, model, micro)
        forward_s = time.perf_counter() - started
        t, index = micro.batch.tensors, torch.tensor(micro.rows, dtype=torch.long)
        ids, attention, mask = t.input_ids[index], t.attention_mask[index], t.loss_mask[index]
        width = int(attention.sum(-1).max())
        ids, attention, mask = ids[:, :width], attention[:, :width], mask[:, :width]
        prefix = shared_prefix_length(ids, attention, mask)
        shapes[state["step"]].append(
            {
                "rows": len(micro.rows),
                "width": width,
                "prefix": prefix,
                "backbone_tokens": prefix + int(attention[:, prefix:].sum()),
                "trained": int(mask.sum()),
                "forward_s": forward_s,
            }
        )
        return loss, metrics

    def timed_accumulate(self, micro_batches, loss_fn):
        """accumulate, with each micro-batch's forward+backward timed (from one loss call to the next)."""
        state["step"] += 1
        starts: list[float] = []

        def timed(micro):
            starts.append(time.perf_counter())
            return loss_fn(micro)

        if state["step"] == args.steps:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
                metrics = accumulate(self, micro_batches, timed)
            state["profile"] = profile
        else:
            metrics = accumulate(self, micro_batches, timed)
        ends = starts[1:] + [time.perf_counter()]
        for s, start, end in zip(shapes[state["step"]], starts, ends):
            s["total_s"] = end - start
        return metrics

    grpo_module.GRPO.loss = recorded_loss
    Trainer.accumulate = timed_accumulate
    result = grpo_module.train_grpo(cfg)
    history = result["history"]

    print(
        f"{cfg.model.name}: batch {cfg.rollout.batch_size} episodes (groups of {cfg.rollout.group_size}), micro-batches of "
        f"{cfg.micro_batch_size}, threads {torch.get_num_threads()}, training precision {cfg.train.mixed_precision}"
    )
    print("| step | rollout s | forward/backward s | optimizer s | episodes trained | profiled |")
    print("|---|---|---|---|---|---|")
    for number, row in enumerate(history, start=1):
        print(
            f"| {number} | {row.get('time/rollout', 0):.1f} | {row['time/forward_backward']:.1f} | "
            f"{row['time/optimizer']:.2f} | {row['train/episodes_trained']:.0f} | {'yes' if number == args.steps else 'no'} |"
        )

    print(
        "\n| step | micro-batch | rows x width | shared prefix | backbone tokens | trained tokens | forward s | "
        "forward+backward s | backbone tokens/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for step, micros in shapes.items():
        for number, s in enumerate(micros, start=1):
            print(
                f"| {step} | {number} | {s['rows']} x {s['width']} | {s['prefix']} | {s['backbone_tokens']} | {s['trained']} | "
                f"{s['forward_s']:.2f} | {s['total_s']:.2f} | {s['backbone_tokens'] / s['total_s']:.0f} |"
            )

    def rate(step: int) -> float:  # backbone tokens per second of forward+backward
        seconds = sum(s["total_s"] for s in shapes[step])
        return sum(s["backbone_tokens"] for s in shapes[step]) / seconds if seconds else 0.0

    events = state["profile"].key_averages()
    by_family: dict[str, float] = defaultdict(float)
    for event in events:
        by_family[family(event.key)] += event.self_cpu_time_total / 1e6
    total = sum(by_family.values())
    print("\n| op family | self CPU s | share |\n|---|---|---|")
    for label, seconds in sorted(by_family.items(), key=lambda item: -item[1]):
        print(f"| {label} | {seconds:.2f} | {seconds / total:.1%} |")
    print(f"| all (profiled) | {total:.2f} | |")
    print("\n| op | family | calls | self CPU s | share |\n|---|---|---|---|---|")
    for event in sorted(events, key=lambda e: -e.self_cpu_time_total)[:15]:
        print(
            f"| {event.key} | {family(event.key)} | {event.count} | {event.self_cpu_time_total / 1e6:.2f} | "
            f"{event.self_cpu_time_total / 1e6 / total:.1%} |"
        )

    print(
        json.dumps(
            {
                "rollout_s": [round(row.get("time/rollout", 0.0), 2) for row in history],
                "forward_backward_s": [round(row["time/forward_backward"], 2) for row in history],
                "backbone_tokens_per_s": [round(rate(step)) for step in shapes],
                "profiled_step": args.steps,
                "median_micro_batch_s": round(statistics.median(s["total_s"] for s in shapes[args.steps]), 2)
                if shapes[args.steps]
                else None,
                "shares": {label: round(seconds / total, 3) for label, seconds in by_family.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
