"""Held-out accuracy against training minutes for the demo: SFT, then GRPO and the compute-matched
SFT control from SFT's end, each the mean over its seeds (the README's plot).

    python experiments/demo_minutes.py --pipeline runs/demo \
        --grpo runs/g1 runs/g1-seen.json runs/g1-new.json --grpo runs/g2 runs/g2-seen.json runs/g2-new.json \
        --control runs/c2 runs/c2-seen.json runs/c2-new.json --control runs/c3 runs/c3-seen.json runs/c3-new.json \
        --out experiments/demo_minutes.png

`--pipeline` is an `agentic-rl pipeline` run with `control.enabled: true`: its SFT stage, its GRPO
stage (seed 0) and its control; each `--grpo` / `--control` adds a seed from the same SFT model, and
`--variant NAME ...` a seed of another RL setting (its own line, e.g. μ = 2): a run
folder (its metrics.jsonl gives the training seconds: rollout batches x the median time of one)
and its evaluation files. A point is the mean accuracy over seeds at the mean training minutes,
with a 95% bootstrap interval over problems of the per-problem mean over seeds (as `agentic-rl
compare` averages seeds). Prints the points as JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from agentic_rl.evaluation.compare import load_evaluations, mean_evaluation
from agentic_rl.evaluation.report import plot_minutes
from agentic_rl.evaluation.stats import accuracy_interval
from agentic_rl.strict_json import read_json
from agentic_rl.training.metrics_file import read_metrics


def median_training_seconds(run: Path) -> float:
    """A run's steps times its median step time (data with rollouts, forward/backward, optimizer):
    its compute, robust to a step that waited on a paused or shared machine (the pipeline's
    `train_seconds` is the plain sum, so a paused control would sit far right of GRPO's minutes).
    With μ = updates_per_batch > 1 only every μ-th step rolls out, so the median is taken over
    the sums of μ consecutive steps (one rollout batch each)."""
    config = read_json(run / "run.json", "give a run folder written by agentic-rl sft/grpo")["config"]
    group = config.get("updates_per_batch", 1)
    times = [
        row.get("time/data", 0.0) + row.get("time/forward_backward", 0.0) + row.get("time/optimizer", 0.0)
        for row in read_metrics(run / "metrics.jsonl")
    ]
    sums = sorted(sum(times[start : start + group]) for start in range(0, len(times) - group + 1, group))
    middle = len(sums) // 2
    median = sums[middle] if len(sums) % 2 else (sums[middle - 1] + sums[middle]) / 2
    return median * config["train"]["steps"] / group


def _stage(root: Path, stage: str) -> tuple[float, dict]:
    """(training seconds, {label: evaluation}) of a pipeline stage."""
    return median_training_seconds(root / stage), load_evaluations(root / f"eval_{stage}")


def _extra(run: str, files: list[str]) -> tuple[float, dict]:
    """(training seconds, {label: evaluation}) of a run folder with its evaluation files."""
    evaluations: dict = {}
    for path in files:
        evaluations.update(load_evaluations(path))
    return median_training_seconds(Path(run)), evaluations


def _mean_point(start_minutes: float, seeds: list[tuple[float, dict]], label: str) -> tuple[float, float, list[float]]:
    minutes = start_minutes + sum(seconds for seconds, _ in seeds) / len(seeds) / 60
    mean = mean_evaluation([evaluations[label] for _, evaluations in seeds], label)
    outcomes = mean["per_task"]["greedy"]
    return minutes, sum(outcomes) / len(outcomes), list(accuracy_interval(outcomes))


def _seeds(runs: list) -> str:
    return "one seed" if len(runs) == 1 else f"mean of {len(runs)} seeds"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipeline", required=True, help="a pipeline run folder with SFT, GRPO and the control")
    parser.add_argument(
        "--grpo",
        nargs="+",
        action="append",
        default=[],
        metavar="RUN_OR_EVAL",
        help="RUN EVAL.json...: one more GRPO seed",
    )
    parser.add_argument(
        "--control",
        nargs="+",
        action="append",
        default=[],
        metavar="RUN_OR_EVAL",
        help="RUN EVAL.json...: one more control seed",
    )
    parser.add_argument(
        "--variant",
        nargs="+",
        action="append",
        default=[],
        metavar="NAME_RUN_OR_EVAL",
        help="NAME RUN EVAL.json...: one seed of another RL setting from the same SFT model, its own line (seeds of one NAME are averaged)",
    )
    parser.add_argument("--out", required=True, help="the PNG to write")
    args = parser.parse_args()

    root = Path(args.pipeline)
    sft_seconds, sft = _stage(root, "sft")
    grpo = [_stage(root, "grpo")] + [_extra(run, files) for run, *files in args.grpo]
    control = [_stage(root, "control")] + [_extra(run, files) for run, *files in args.control]
    mu = read_json(root / "grpo" / "run.json", "give a pipeline run folder")["config"].get("updates_per_batch", 1)
    variants: dict[str, list] = {}
    for name, run, *files in args.variant:
        variants.setdefault(name, []).append(_extra(run, files))
    sft_minutes = sft_seconds / 60
    series = {}
    for label, evaluation in sft.items():
        start = (sft_minutes, evaluation["pass@1"], list(accuracy_interval(evaluation["per_task"]["greedy"])))
        series[label] = {
            "SFT": [start],
            f"GRPO μ = {mu}, {_seeds(grpo)}": [start, _mean_point(sft_minutes, grpo, label)],
            f"SFT control, {_seeds(control)}": [start, _mean_point(sft_minutes, control, label)],
        }
        for name, runs in variants.items():
            series[label][f"{name}, {_seeds(runs)}"] = [start, _mean_point(sft_minutes, runs, label)]
    plot_minutes(series, Path(args.out), title="configs/demo.yaml: greedy pass@1 on held-out problems")
    print(json.dumps(series, indent=1))


if __name__ == "__main__":
    main()
