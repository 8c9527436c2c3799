"""Rollouts of episodes whose history is not a prefix: forking the running prefix vs prefilling every sequence.

    .venv/bin/python benchmarks/nonprefix_fork.py [--episodes 8] [--max-turns 8] [--repeats 2] [--dtype auto]

Model: the embedded SmolLM2-135M-Instruct (no adapters), greedy, on `memory` tasks of
configs/memory.yaml's two-facts evaluation (facts 2, distractors 6, gap 3, window 2), cut at
`--max-turns` (the evaluation allows 18; 8 keeps one side under a few minutes on 2 fp32 cores).
Once its window is full every turn starts a new token sequence (engine.py), whose prompt opens
with the system prompt and the memory tools' schemas that every running episode's cache holds.

Two sides, the same episodes and engine settings:
* fork:    the backend forks the longest prefix a running episode's cache holds (the default);
* prefill: `min_shared_prefix` set out of reach, so each new sequence is prefilled in full
           (the code before the fork; episodes starting in one step still share their prefix).
The sides alternate per repeat (prefill, fork, ...) so a shared machine's noise hits both; each
side's trajectories must be token-identical to the other's. Reported per side: median, min and
max seconds, tokens the model computed, forks; and the ratio of the medians. The last line is JSON.
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

MODEL = "smollm2-135m-instruct"
OPTIONS = {"facts": 2, "distractors": 6, "gap": 3, "window": 2}


def run(
    model, tokenizer, tasks, dtype: str, max_turns: int, fork: bool
) -> tuple[float, int, int, list[list[list[int]]]]:
    rollout = RolloutConfig(max_turn_tokens=48, max_turns=max_turns, sampling=Sampling(temperature=0), dtype=dtype)
    engine = build_engine(model, tokenizer, rollout, seed=0, max_concurrent=len(tasks))
    backend = engine.backend
    if not fork:
        backend.min_shared_prefix = 10**9
    computed = 0
    forward = backend.runner.forward

    def counting(slots, chunks):
        nonlocal computed
        computed += sum(len(chunk) for chunk in chunks)
        return forward(slots, chunks)

    backend.runner.forward = counting
    started = time.perf_counter()
    with torch.no_grad():
        episodes = engine.run([make_env("memory", **OPTIONS) for _ in tasks], tasks)
    seconds = time.perf_counter() - started
    return seconds, computed, backend.prefix_forks, [[seq.input_ids for seq in e.sequences()] for e in episodes]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--max-turns", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    args = parser.parse_args()
    model, tokenizer, _ = load_base_and_tokenizer(MODEL, "float32")
    tasks = make_env("memory", **OPTIONS).tasks("test", n=args.episodes, seed=0)
    times: dict[str, list[float]] = {"prefill": [], "fork": []}
    stats: dict[str, tuple[int, int]] = {}
    ids: dict[str, list] = {}
    for _ in range(args.repeats):
        for side in ("prefill", "fork"):
            seconds, computed, forks, sequences = run(
                model, tokenizer, tasks, args.dtype, args.max_turns, side == "fork"
            )
            times[side].append(seconds)
            stats[side], ids[side] = (computed, forks), sequences
    if ids["fork"] != ids["prefill"]:
        raise SystemExit("the two sides produced different trajectories")
    sequences = sum(len(e) for e in ids["fork"])
    print(
        f"{args.episodes} memory episodes, {sequences} token sequences, greedy, rollout.dtype={args.dtype}, "
        f"max_turns {args.max_turns}, {torch.get_num_threads()} threads"
    )
    for side in ("prefill", "fork"):
        t = times[side]
        print(
            f"{side:8s} median {statistics.median(t):7.1f} s  [min {min(t):.1f}, max {max(t):.1f}]  "
            f"tokens computed {stats[side][0]:,}  forks {stats[side][1]}"
        )
    ratio = statistics.median(times["prefill"]) / statistics.median(times["fork"])
    print(f"prefill / fork: {ratio:.2f}x time, {stats['prefill'][0] / stats['fork'][0]:.2f}x tokens computed")
    print(
        json.dumps(
            {
                "time_ratio": round(ratio, 3),
                "tokens_ratio": round(stats["prefill"][0] / stats["fork"][0], 3),
                "fork_median_s": round(statistics.median(times["fork"]), 2),
                "prefill_median_s": round(statistics.median(times["prefill"]), 2),
            }
        )
    )


if __name__ == "__main__":
    main()
