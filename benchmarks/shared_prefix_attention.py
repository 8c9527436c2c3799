"""Shared-prefix attention A/B: the rollout engine on FastRunner with and without it, side by side.

    .venv/bin/python benchmarks/shared_prefix_attention.py [--dtype bfloat16] [--repeats 3]
        [--batch-sizes 8,32] [--max-new-tokens 64] [--multi-turn-episodes 32]

Model: the embedded SmolLM2-135M-Instruct. Prompts are real `arith` prompts (system prompt and
the calculator's tool schema, then the problem), so the episodes share a long prompt prefix that
the engine prefills once and forks into every slot. Both sides are the same engine on a
FastRunner; one is built with `shared_prefix=0` (every row attends its whole cache), the other
with the default (rows that share the forked prefix attend it once per call, see fast_runner.py).
Episodes are identical on both sides: stop tokens are disabled (turns end at the token limit)
and observations are scripted calculator results, as in rollout_throughput.py.

Rows:
  single-turn b=N   N episodes of one turn of --max-new-tokens.
  multi-turn        --multi-turn-episodes episodes of --turns turns of --turn-tokens (the shape
                    of a GRPO rollout batch).
Repeats are interleaved (off, on, off, on, ...) so the noise of a shared machine hits both alike.
Each row reports median / min / max generated tokens per second and the ratio of the medians;
the last line is JSON with the ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from rollout_throughput import _NoStopFormat, _ScriptedToolEnv

from agentic_rl.envs.base import make_env
from agentic_rl.models.chat_format import ChatFormat
from agentic_rl.models.loader import load_model
from agentic_rl.rollout.engine import RolloutEngine, RolloutLimits
from agentic_rl.rollout.fast_runner import FastRunner
from agentic_rl.rollout.sampling import SamplingParams


def engine_rate(model, tokenizer, shared_prefix: int | None, episodes: int, turns: int, turn_tokens: int,
                max_len: int, seed: int) -> tuple[float, int]:
    """Generated tokens per second of one engine run, and how many forward calls used the shared prefix."""
    kwargs = {} if shared_prefix is None else {"shared_prefix": shared_prefix}
    runner = FastRunner(model, max_slots=episodes, max_len=max_len, **kwargs)
    tasks = make_env("arith").tasks("test", n=episodes, seed=0)
    envs = [_ScriptedToolEnv(turns, make_env("arith")) for _ in range(episodes)]
    limits = RolloutLimits(max_turn_tokens=turn_tokens, max_episode_tokens=max_len, max_turns=turns)
    engine = RolloutEngine(runner, _NoStopFormat(tokenizer), tokenizer, limits, SamplingParams(temperature=1.0, seed=seed))
    start = time.perf_counter()
    trajectories = engine.run(envs, tasks)
    seconds = time.perf_counter() - start
    return sum(t.num_policy_tokens for t in trajectories) / seconds, runner.shared_prefix_calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-sizes", default="8,32")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--multi-turn-episodes", type=int, default=32, help="0 skips the multi-turn row")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--turn-tokens", type=int, default=32)
    parser.add_argument("--max-len", type=int, default=1024)
    args = parser.parse_args()

    model, tokenizer = load_model("smollm2-135m-instruct", dtype=getattr(torch, args.dtype))
    model.eval()
    env = make_env("arith")
    first = ChatFormat.for_tokenizer(tokenizer).prompt_ids(env.reset(env.tasks("test", n=1, seed=0)[0]), env.tool_schemas)
    print(f"# SmolLM2-135M-Instruct, {args.dtype}, FastRunner linear=auto, threads={torch.get_num_threads()}, "
          f"arith prompts ({len(first)} tokens for the first)")
    shapes = [(f"single-turn b={b}", b, 1, args.max_new_tokens) for b in (int(x) for x in args.batch_sizes.split(",") if x)]
    if args.multi_turn_episodes:
        shapes.append((f"multi-turn {args.multi_turn_episodes}x{args.turns}x{args.turn_tokens}",
                       args.multi_turn_episodes, args.turns, args.turn_tokens))
    engine_rate(model, tokenizer, None, 2, 1, 4, args.max_len, seed=0)  # warm-up
    ratios, lines = {}, []
    for name, episodes, turns, turn_tokens in shapes:
        rates: dict[str, list[float]] = {"off": [], "on": []}
        shared_calls = 0
        for repeat in range(args.repeats):
            for side, shared in (("off", 0), ("on", None)):
                rate, calls = engine_rate(model, tokenizer, shared, episodes, turns, turn_tokens, args.max_len, seed=repeat)
                rates[side].append(rate)
                if side == "on":
                    shared_calls = calls
        off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
        ratios[name] = on / off
        lines.append(f"| {name} | {off:.0f} ({min(rates['off']):.0f}-{max(rates['off']):.0f}) | "
                     f"{on:.0f} ({min(rates['on']):.0f}-{max(rates['on']):.0f}) | {on / off:.2f}x | {shared_calls} |")
        print(lines[-1], flush=True)
    print("\n| row | off: tok/s median (min-max) | on: tok/s median (min-max) | on / off | shared calls (last on run) |")
    print("|---|---|---|---|---|")
    print("\n".join(lines))
    print(json.dumps({"shared_over_full": ratios, "dtype": args.dtype, "repeats": args.repeats}))


if __name__ == "__main__":
    main()
