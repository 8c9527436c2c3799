"""How far apart one gradient comes out when summed in two orders, in float32, in float64 with
transformers' float32 RMSNorms (`.double()`), and fully in float64 (tests' `float64_model`): the
numbers behind tests/helpers_references.py's REORDERED_SUM_RTOL. The batch and layouts are those
of tests/test_grpo_trainer.py::test_one_process_trains_only_the_live_rows_whatever_the_micro_batch_size
(5 live rows of 8 in micro-batches of 4, skipped against unskipped). Prints the worst
|skipped − full| / max|full| over the LoRA tensors.

    .venv/bin/python experiments/reordered_sum.py
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from helpers_references import float64_model  # noqa: E402
from helpers_training import accumulated_gradient, first_batch, grpo_cfg  # noqa: E402


def worst_relative_difference(cfg, model, objective, batch) -> float:
    grads = []
    for skip in (True, False):
        objective.cfg = dataclasses.replace(cfg, skip_zero_advantage=skip)
        grads.append(accumulated_gradient(model, objective, batch)[0])
    skipped, full = grads
    return max(float((skipped[n] - full[n]).abs().max() / full[n].abs().max()) for n in full)


def main() -> None:
    cfg = grpo_cfg(
        Path(tempfile.mkdtemp()),
        "loss.beta=0",
        "rollout.batch_size=8",
        "rollout.group_size=4",
        "rollout.max_turn_tokens=6",
        "micro_batch_size=4",
    )
    model, objective, batch = first_batch(cfg)
    batch.advantages[:3] = 0.0
    print(f"float32:                        {worst_relative_difference(cfg, model, objective, batch):.2e}")
    model.double()
    print(f".double() (float32 RMSNorms):   {worst_relative_difference(cfg, model, objective, batch):.2e}")
    float64_model(model)
    print(f"float64_model:                  {worst_relative_difference(cfg, model, objective, batch):.2e}")


if __name__ == "__main__":
    main()
