"""One real GRPO update at several micro-batch sizes, side by side on the same rollout batch.

    .venv/bin/python benchmarks/update_micro_batch.py --config configs/experiments/plan-wide-grpo.yaml \
        --set model.name=runs/plan-short/sft/final --sizes 4 8 [--repeats 3]

Rolls out one real batch with the config (train_grpo's own first step, into a temporary folder),
then runs that batch's forward/backward (`Trainer.accumulate` over `GRPO.micro_batches`, exactly
what the step runs) once per size in `--sizes`, interleaved over `--repeats` rounds (a, b, a, b,
...) after `--warmup` unrecorded ones, so a noisy machine hits every side alike; gradients are
zeroed after each pass, so every pass starts from the same weights.

`micro_batch_size` changes only how rows are grouped per forward/backward. The summed gradient is
the same up to float rounding (in float32: `test_gradient_is_the_same_for_any_micro_batch_size`,
tests/test_grpo_trainer.py; bf16 autocast rounds differently, so every pass's gradient norm is
printed). What changes is the cost: the prefix a micro-batch runs once shrinks when it holds rows
of several groups (one group shares its whole prompt, two only the system prompt and tool
schemas), and the per-pass overhead is paid fewer times. Printed per size: the median and range of
seconds, the ratio to the first size, and the gradient norms; the last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch

from agentic_rl.config import load_config
from agentic_rl.training import grpo as grpo_module
from agentic_rl.training.grpo_config import GRPOConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="unrecorded rounds first")
    args = parser.parse_args()

    out_dir = tempfile.mkdtemp(prefix="micro-batch-")
    cfg = load_config(
        GRPOConfig,
        args.config,
        args.overrides
        + ["train.steps=1", f"train.output_dir={out_dir}", "train.checkpoint_every=0", "train.progress=false"],
    )
    times: dict[int, list[float]] = {size: [] for size in args.sizes}
    norms: dict[int, list[float]] = {size: [] for size in args.sizes}
    shape: dict[str, int] = {}
    step_of = grpo_module.GRPO.step

    def compared_step(self, trainer, step):
        batch = self.batch_for(step)
        rows = self.rows_to_train(batch)
        shape.update(rows=len(rows), episodes=batch.episodes, tokens=int(batch.tensors.attention_mask[rows].sum()))
        configured = self.cfg.micro_batch_size
        for round_ in range(args.warmup + args.repeats):
            for size in args.sizes:
                self.cfg.micro_batch_size = size
                started = time.perf_counter()
                trainer.accumulate(self.micro_batches(batch, rows), lambda micro: self.loss(trainer.model, micro))
                if round_ < args.warmup:
                    trainer.model.zero_grad(set_to_none=True)
                    continue
                times[size].append(time.perf_counter() - started)
                grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
                norms[size].append(float(torch.linalg.vector_norm(torch.stack([g.float().norm() for g in grads]))))
                trainer.model.zero_grad(set_to_none=True)
        self.cfg.micro_batch_size = configured
        return step_of(self, trainer, step)  # the step itself, on the same batch (batch_for reuses it)

    grpo_module.GRPO.step = compared_step
    grpo_module.train_grpo(cfg)

    first = statistics.median(times[args.sizes[0]])
    print(
        f"{cfg.model.name}, {cfg.env.name}: one rollout batch of {shape['episodes']} episodes, {shape['rows']} rows trained "
        f"({shape['tokens']} tokens), threads {torch.get_num_threads()}, training precision {cfg.train.mixed_precision}, "
        f"{args.repeats} rounds interleaved"
    )
    print(
        "| micro_batch_size | passes | forward/backward s, median (min-max) | ratio to the first | gradient norm of each pass |"
    )
    print("|---|---|---|---|---|")
    for size in args.sizes:
        median = statistics.median(times[size])
        print(
            f"| {size} | {-(-shape['rows'] // size)} | {median:.2f} ({min(times[size]):.2f}-{max(times[size]):.2f}) | "
            f"{median / first:.2f} | {', '.join(f'{norm:.6g}' for norm in norms[size])} |"
        )
    print(
        json.dumps(
            {
                "sizes": args.sizes,
                "median_s": [round(statistics.median(times[s]), 2) for s in args.sizes],
                "speedup_over_first": [round(first / statistics.median(times[s]), 3) for s in args.sizes],
                "grad_norms": [norms[s] for s in args.sizes],
                "rows": shape["rows"],
            }
        )
    )


if __name__ == "__main__":
    main()
