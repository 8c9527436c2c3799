"""FastRunner A/B on agent episodes: the rollout engine on two FastRunner settings, side by side.

    .venv/bin/python benchmarks/fast_runner_ab.py [--dtype bfloat16] [--repeats 3]
        [--batch-sizes 8,32] [--max-new-tokens 64] [--multi-turn-episodes 32]
        [--a shared_prefix=0] [--b ""]               # the default A/B: shared-prefix attention off / on
    .venv/bin/python benchmarks/fast_runner_ab.py --dtype float32 --a linear=mm --b linear=mkldnn
    .venv/bin/python benchmarks/fast_runner_ab.py --dtype float32 --a linear=mkldnn --b dtype=bfloat16
                                                     # rollout.dtype float32 against bfloat16 copies, fp32 model

Model: the embedded SmolLM2-135M-Instruct. Prompts are real `arith` prompts (system prompt and
the calculator's tool schema, then the problem), so the episodes share a long prompt prefix that
the engine prefills once and forks into every slot. Both sides are the same engine on a
FastRunner built with the keyword arguments of `--a` and `--b` (comma-separated KEY=VALUE; empty
means FastRunner's defaults; `dtype=bfloat16` gives a side bf16 copies of the model). The default
A/B is shared-prefix attention: A is built with `shared_prefix=0` (every row attends its whole
cache), B with the defaults (rows that share the forked prefix attend it once per call, see
fast_runner.py).
Episodes are identical on both sides: stop tokens are disabled (turns end at the token limit)
and observations are scripted calculator results, as in rollout_throughput.py.

Rows:
  single-turn b=N   N episodes of one turn of --max-new-tokens.
  multi-turn        --multi-turn-episodes episodes of --turns turns of --turn-tokens (the shape
                    of a GRPO rollout batch).
Repeats are interleaved (A, B, A, B, ...) so the noise of a shared machine hits both alike.
Each row reports median / min / max generated tokens per second, the ratio of the medians B / A,
and how many forward calls of B's last run attended a shared prefix once; a line per side gives
the median seconds of `sync_weights()` (rebuilding the copies, which a trainer does after every
update); the last line is JSON with the ratios.
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
from agentic_rl.rollout.backend import RunnerBackend
from agentic_rl.rollout.config import RolloutConfig
from agentic_rl.rollout.engine import RolloutEngine
from agentic_rl.rollout.fast_runner import FastRunner
from agentic_rl.rollout.sampling import SamplingParams


def runner_kwargs(text: str) -> dict[str, bool | int | str | torch.dtype]:
    """ "linear=mkldnn,shared_prefix=0" -> {"linear": "mkldnn", "shared_prefix": 0}; "" -> {}.

    Values are ints ("0"), booleans ("true"/"false", any case), torch dtypes for `dtype`
    ("bfloat16", "float32") or strings."""
    kwargs: dict[str, bool | int | str | torch.dtype] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"FastRunner setting {item!r}: expected KEY=VALUE, e.g. linear=mkldnn")
        if key == "dtype":
            kwargs[key] = getattr(torch, value)
        elif value.lstrip("-").isdigit():
            kwargs[key] = int(value)
        elif value.lower() in ("true", "false"):
            kwargs[key] = value.lower() == "true"
        else:
            kwargs[key] = value
    return kwargs


def engine_rate(
    model, tokenizer, kwargs: dict, episodes: int, turns: int, turn_tokens: int, max_len: int, seed: int
) -> tuple[float, int]:
    """Generated tokens per second of one engine run, and how many forward calls used the shared prefix."""
    runner = FastRunner(model, max_slots=episodes, max_len=max_len, **kwargs)
    tasks = make_env("arith").tasks("test", n=episodes, seed=0)
    envs = [_ScriptedToolEnv(turns, make_env("arith")) for _ in range(episodes)]
    limits = RolloutConfig(max_turn_tokens=turn_tokens, max_episode_tokens=max_len, max_turns=turns)
    chat_format = _NoStopFormat(tokenizer)
    engine = RolloutEngine(
        RunnerBackend(runner, chat_format), chat_format, tokenizer, limits, SamplingParams(temperature=1.0, seed=seed)
    )
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
    parser.add_argument("--a", default="shared_prefix=0", help="FastRunner keyword arguments of side A (KEY=VALUE,...)")
    parser.add_argument("--b", default="", help="FastRunner keyword arguments of side B (empty: the defaults)")
    args = parser.parse_args()
    sides = {"A": runner_kwargs(args.a), "B": runner_kwargs(args.b)}

    model, tokenizer = load_model("smollm2-135m-instruct", dtype=getattr(torch, args.dtype))
    model.eval()
    env = make_env("arith")
    first = ChatFormat.for_tokenizer(tokenizer).prompt_ids(
        env.reset(env.tasks("test", n=1, seed=0)[0]), env.tool_schemas
    )
    built = {
        side: FastRunner(model, max_slots=1, max_len=8, **kw) for side, kw in sides.items()
    }  # rejects bad settings now
    print(
        f"# SmolLM2-135M-Instruct, {args.dtype}, threads={torch.get_num_threads()}, arith prompts ({len(first)} tokens "
        f"for the first); A: {sides['A'] or 'defaults'} (linear={built['A'].linear}, shared_prefix="
        f"{built['A'].shared_prefix}); B: {sides['B'] or 'defaults'} (linear={built['B'].linear}, "
        f"shared_prefix={built['B'].shared_prefix})"
    )
    shapes = [
        (f"single-turn b={b}", b, 1, args.max_new_tokens) for b in (int(x) for x in args.batch_sizes.split(",") if x)
    ]
    if args.multi_turn_episodes:
        shapes.append(
            (
                f"multi-turn {args.multi_turn_episodes}x{args.turns}x{args.turn_tokens}",
                args.multi_turn_episodes,
                args.turns,
                args.turn_tokens,
            )
        )
    for side, runner in built.items():  # warm-up, and the cost of one refresh of the copies
        engine_rate(model, tokenizer, sides[side], 2, 1, 4, args.max_len, seed=0)
        refresh = []
        for _ in range(3):
            started = time.perf_counter()
            runner.sync_weights()
            refresh.append(time.perf_counter() - started)
        print(f"# {side}: sync_weights {statistics.median(refresh):.3f} s (median of 3)", flush=True)
    ratios, lines = {}, []
    for name, episodes, turns, turn_tokens in shapes:
        rates: dict[str, list[float]] = {"A": [], "B": []}
        shared_calls = 0
        for repeat in range(args.repeats):
            for side, kwargs in sides.items():
                rate, calls = engine_rate(
                    model, tokenizer, kwargs, episodes, turns, turn_tokens, args.max_len, seed=repeat
                )
                rates[side].append(rate)
                if side == "B":
                    shared_calls = calls
        a, b = statistics.median(rates["A"]), statistics.median(rates["B"])
        ratios[name] = b / a
        lines.append(
            f"| {name} | {a:.0f} ({min(rates['A']):.0f}-{max(rates['A']):.0f}) | "
            f"{b:.0f} ({min(rates['B']):.0f}-{max(rates['B']):.0f}) | {b / a:.2f}x | {shared_calls} |"
        )
        print(lines[-1], flush=True)
    print("\n| row | A: tok/s median (min-max) | B: tok/s median (min-max) | B / A | shared calls (last B run) |")
    print("|---|---|---|---|---|")
    print("\n".join(lines))
    print(json.dumps({"b_over_a": ratios, "a": args.a, "b": args.b, "dtype": args.dtype, "repeats": args.repeats}))


if __name__ == "__main__":
    main()
