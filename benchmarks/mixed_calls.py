"""Mixed calls: plan's evaluation with one-token chunks run apart from observations, against one padded call.

    .venv/bin/python benchmarks/mixed_calls.py [--model runs/plan-fast/sft/final] [--n 32] [--repeats 2] [--dtype auto]

Model: a plan SFT model (`agentic-rl sft --config configs/experiments/plan-fast-sft.yaml` writes
runs/plan-fast/sft/final); the base model makes no tool call, so its episodes end at their first turn.
Episodes: `--n` held-out one-door houses (difficulty 1, branching 1, 12 turns), greedy, all decoding
at once, with the evaluation's limits (48 tokens a turn, 1,792 an episode): `agentic-rl eval`'s
rollouts on plan without its bookkeeping.

Two sides, the same episodes and engine (FastRunner, "Mixed calls" in its docstring):
* one call: `split_mixed=False`: every step's rows in one call, padded to its longest chunk;
* split:    the default: one-token chunks apart from longer ones when their padding would
            outnumber the call's tokens.
The sides alternate per repeat (one call first) so a shared machine's noise hits both. Reported per
side: median, min and max seconds, model calls (and how many were split), houses solved; the
episodes whose tokens differ between the sides (fp32 should give none; bf16 rounds a product
differently when a matmul's shape changes, and greedy decoding can then part at a near-tie); and
the ratio of the medians. The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from agentic_rl.envs.base import make_env
from agentic_rl.models.stage_output import load_base_and_tokenizer
from agentic_rl.rollout.config import RolloutConfig, Sampling
from agentic_rl.rollout.factory import build_engine

OPTIONS = {"difficulty": 1, "branching": 1, "max_turns": 12}


def run(model, tokenizer, tasks, dtype: str, split: bool) -> tuple[float, int, int, int, list[list[int]]]:
    """(seconds, model calls, split calls, houses solved, each episode's token ids) for one side."""
    rollout = RolloutConfig(
        max_turn_tokens=48, max_turns=12, max_episode_tokens=1792, sampling=Sampling(temperature=0), dtype=dtype
    )
    engine = build_engine(model, tokenizer, rollout, seed=0, max_concurrent=len(tasks))
    runner = engine.backend.runner
    if not hasattr(runner, "split_mixed"):
        raise SystemExit(f"the engine runs {type(runner).__name__}, not FastRunner: nothing to compare")
    runner.split_mixed = split
    started = time.perf_counter()
    with torch.no_grad():
        episodes = engine.run([make_env("plan", **OPTIONS) for _ in tasks], tasks)
    seconds = time.perf_counter() - started
    solved = sum(bool(e.info.get("correct")) for e in episodes)
    return seconds, engine.backend.forward_calls, runner.split_calls, solved, [e.input_ids for e in episodes]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="runs/plan-fast/sft/final")
    parser.add_argument("--n", type=int, default=32, help="held-out houses, all decoding at once")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    args = parser.parse_args()
    model, tokenizer, _ = load_base_and_tokenizer(args.model, "float32")
    tasks = make_env("plan", **OPTIONS).tasks("test", n=args.n, seed=0)
    times: dict[str, list[float]] = {"one call": [], "split": []}
    stats: dict[str, tuple[int, int, int]] = {}
    ids: dict[str, list] = {}
    for _ in range(args.repeats):
        for side in times:
            seconds, calls, splits, solved, tokens = run(model, tokenizer, tasks, args.dtype, side == "split")
            times[side].append(seconds)
            stats[side], ids[side] = (calls, splits, solved), tokens
    differ = sum(a != b for a, b in zip(ids["one call"], ids["split"]))
    print(
        f"{args.n} plan houses (one door), greedy, rollout.dtype={args.dtype}, {torch.get_num_threads()} threads; "
        f"model {args.model}"
    )
    for side, t in times.items():
        calls, splits, solved = stats[side]
        print(
            f"{side:8s} median {statistics.median(t):6.1f} s  [min {min(t):.1f}, max {max(t):.1f}]  "
            f"forward calls {calls} ({splits} of them split in two)  solved {solved}/{args.n}"
        )
    ratio = statistics.median(times["one call"]) / statistics.median(times["split"])
    print(f"one call / split: {ratio:.2f}x time; episodes whose tokens differ: {differ}/{args.n}")
    print(
        json.dumps(
            {
                "time_ratio": round(ratio, 3),
                "split_median_s": round(statistics.median(times["split"]), 2),
                "one_call_median_s": round(statistics.median(times["one call"]), 2),
                "episodes_differ": differ,
                "solved": {side: stats[side][2] for side in times},
            }
        )
    )


if __name__ == "__main__":
    main()
