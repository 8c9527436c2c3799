"""Rollout throughput: the RolloutEngine against transformers' `model.generate`, side by side.

    .venv/bin/python benchmarks/rollout_throughput.py                      # full run (the lead's)
    .venv/bin/python benchmarks/rollout_throughput.py --repeats 1 --batch-sizes 4 \\
        --max-new-tokens 16 --multi-turn-episodes 4 --turn-tokens 8         # smoke run

Model: the embedded SmolLM2-135M-Instruct. Both sides use the same prompts, the same dtype,
the same sampling temperature and exactly the same number of generated tokens per row: stop
tokens are disabled on both sides (generate: min_new_tokens = max_new_tokens; engine: a
ChatFormat whose turns only end at the token limit), and throughput counts the tokens each
side actually produced.

Rows:
  single-turn b=N   N prompts, one turn of --max-new-tokens each: short built-in questions, or
                    with --single-turn-prompts arith the arith env's prompts (system prompt and
                    tool schema, ~430 tokens, as rollouts see them).
  multi-turn        --multi-turn-episodes episodes of --turns turns of --turn-tokens each. Prompts
                    come from the arith env when it is importable (else a built-in question);
                    observations are scripted calculator results after every turn, so both sides
                    run the same episode shapes. `generate` must re-encode the whole conversation
                    after each tool call (no KV reuse across turns); the engine prefills only the
                    observation.
Each row reports median / min / max generated tokens per second over --repeats, and the last
line is JSON with the engine/generate ratios of the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

from agentic_rl.envs.base import Env, StepResult, Task
from agentic_rl.models.chat_format import ChatFormat
from agentic_rl.models.loader import load_model
from agentic_rl.rollout.backend import RunnerBackend
from agentic_rl.rollout.config import RolloutConfig
from agentic_rl.rollout.engine import RolloutEngine
from agentic_rl.rollout.hf_runner import HFRunner
from agentic_rl.rollout.sampling import SamplingParams

QUESTIONS = [
    "Maya has $48. She spends $12 on a lamp, then doubles what is left. How much does she have?",
    "A baker makes 7 trays of 12 rolls and sells 30. How many rolls are left?",
    "Liam saves $15 a week for 6 weeks and spends a third. How much remains?",
    "Four friends share 52 stickers equally and each gives 3 away. How many does each keep?",
]


class _NoStopFormat(ChatFormat):
    """Turns end only at the token limit, so both sides generate exactly the same counts."""

    def ends_turn(self, turn_ids) -> bool:
        return False


class _ScriptedToolEnv(Env):
    """Arith-like episodes: a calculator observation after each turn until `turns`, then done."""

    name = "bench-tools"
    max_turns = 64

    def __init__(self, turns: int, base: Env | None = None):
        self.turns, self.base, self.turn = turns, base, 0

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        return self.base.tool_schemas if self.base is not None else []

    def reset(self, task: Task) -> list[dict[str, Any]]:
        self.turn = 0
        if self.base is not None:
            return self.base.reset(task)
        return [
            {"role": "system", "content": "Solve the problem with the calculator."},
            {"role": "user", "content": task.question},
        ]

    def step(self, action_text: str) -> StepResult:
        self.turn += 1
        if self.turn >= self.turns:
            return StepResult(None, 0.0, True, {"final_answer": None})
        return StepResult([{"role": "tool", "name": "calculator", "content": str(17 * self.turn)}], 0.0, False, {})


def _tasks_and_envs(n: int, turns: int) -> tuple[list[Task], list[Env], str]:
    try:
        try:
            from agentic_rl.envs import make_env
        except ImportError:
            from agentic_rl.envs.base import make_env

        probe = make_env("arith")
        tasks = probe.tasks("test", n=n, seed=0)
        return tasks, [_ScriptedToolEnv(turns, make_env("arith")) for _ in range(n)], "arith prompts"
    except Exception as exc:  # noqa: BLE001 - the arith env may not exist yet
        tasks = [Task(f"q{i}", QUESTIONS[i % len(QUESTIONS)], "") for i in range(n)]
        return tasks, [_ScriptedToolEnv(turns) for _ in range(n)], f"built-in prompts (arith unavailable: {exc})"


def _make_runner(kind: str, model, max_slots: int, max_len: int):
    if kind == "fast":
        from agentic_rl.rollout.fast_runner import FastRunner

        return FastRunner(model, max_slots=max_slots, max_len=max_len)
    return HFRunner(model, max_slots=max_slots, max_len=max_len)


def _engine_run(model, tokenizer, args, envs, tasks, turn_tokens: int, turns: int, seed: int) -> tuple[int, float]:
    runner = _make_runner(args.runner, model, max_slots=len(envs), max_len=args.max_len)
    limits = RolloutConfig(max_turn_tokens=turn_tokens, max_episode_tokens=args.max_len, max_turns=turns)
    chat_format = _NoStopFormat(tokenizer)
    engine = RolloutEngine(
        RunnerBackend(runner, chat_format),
        chat_format,
        tokenizer,
        limits,
        SamplingParams(temperature=args.temperature, seed=seed),
    )
    start = time.perf_counter()
    trajectories = engine.run(envs, tasks)
    elapsed = time.perf_counter() - start
    return sum(t.num_policy_tokens for t in trajectories), elapsed


@torch.no_grad()
def _generate(
    model, tokenizer, sequences: list[list[int]], new_tokens: int, temperature: float
) -> tuple[list[list[int]], float]:
    """Left-padded batch generate of exactly `new_tokens` per row; returns the new tokens and seconds."""
    width = max(len(s) for s in sequences)
    pad = tokenizer.pad_token_id
    device = next(model.parameters()).device  # benchmarks/gpu_check.py runs this on a GPU
    input_ids = torch.tensor([[pad] * (width - len(s)) + s for s in sequences], device=device)  # (B, T)
    attention = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in sequences], device=device)  # (B, T)
    start = time.perf_counter()
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=temperature > 0,
        temperature=temperature if temperature > 0 else None,
        top_p=None,
        top_k=None,
        pad_token_id=pad,
    )
    new = out[:, width:].tolist()  # the copy to the host waits for the GPU, inside the timing
    return new, time.perf_counter() - start


def _generate_episodes(
    model, tokenizer, chat_format, envs, tasks, turn_tokens: int, turns: int, temperature: float
) -> tuple[int, float]:
    """The naive multi-turn loop: after each turn, re-encode every episode's whole token sequence."""
    sequences = [chat_format.prompt_ids(env.reset(task), env.tool_schemas) for env, task in zip(envs, tasks)]
    messages = [env.reset(task) for env, task in zip(envs, tasks)]
    active, generated, seconds = list(range(len(envs))), 0, 0.0
    for _ in range(turns):
        new, elapsed = _generate(model, tokenizer, [sequences[i] for i in active], turn_tokens, temperature)
        seconds += elapsed
        still = []
        for i, turn in zip(active, new):
            generated += len(turn)
            start = time.perf_counter()  # the env and rendering count as rollout time for both sides
            text = tokenizer.decode(turn)
            result = envs[i].step(text)
            if not result.done:
                sequences[i] = (
                    sequences[i]
                    + turn
                    + chat_format.observation_ids(messages[i], text, result.observation, envs[i].tool_schemas)
                )
                messages[i] = messages[i] + [{"role": "assistant", "content": text}] + result.observation
                still.append(i)
            seconds += time.perf_counter() - start
        active = still
        if not active:
            break
    return generated, seconds


def _row(name: str, rates: list[float]) -> dict[str, Any]:
    return {"row": name, "median": statistics.median(rates), "min": min(rates), "max": max(rates)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per row (median/min/max reported)")
    parser.add_argument("--batch-sizes", default="8,32", help="comma-separated single-turn batch sizes")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens per row in the single-turn rows")
    parser.add_argument(
        "--multi-turn-episodes", type=int, default=8, help="episodes in the multi-turn row (0 skips it)"
    )
    parser.add_argument("--turns", type=int, default=3, help="policy turns per multi-turn episode")
    parser.add_argument("--turn-tokens", type=int, default=32, help="tokens per turn in the multi-turn row")
    parser.add_argument(
        "--runner", choices=["hf", "fast"], default="hf", help="the engine's runner (fast = FastRunner)"
    )
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="model dtype, both sides")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature, both sides")
    parser.add_argument("--max-len", type=int, default=2048, help="runner cache length per slot")
    parser.add_argument(
        "--single-turn-prompts",
        choices=["short", "arith"],
        default="short",
        help="single-turn rows: short built-in questions (~50 tokens, no tools) or arith "
        "prompts with the calculator's tool schema (~430 tokens, the agent case)",
    )
    args = parser.parse_args()

    model, tokenizer = load_model("smollm2-135m-instruct", dtype=getattr(torch, args.dtype))
    chat_format = ChatFormat.for_tokenizer(tokenizer)
    print(
        f"# SmolLM2-135M-Instruct, {args.dtype}, runner={args.runner}, T={args.temperature}, threads={torch.get_num_threads()}"
    )
    rows, ratios = [], {}
    # Warm-up (untimed): first calls pay one-off allocation and kernel selection costs.
    warm_tasks = [Task("w", QUESTIONS[0], "")]
    _engine_run(model, tokenizer, args, [_ScriptedToolEnv(1)], warm_tasks, 4, 1, seed=0)
    _generate(
        model, tokenizer, [chat_format.prompt_ids([{"role": "user", "content": QUESTIONS[0]}])], 4, args.temperature
    )
    for batch in [int(b) for b in args.batch_sizes.split(",") if b]:
        tasks = [Task(f"q{i}", QUESTIONS[i % len(QUESTIONS)], "") for i in range(batch)]
        engine_rates, generate_rates = [], []
        for repeat in range(args.repeats):
            if args.single_turn_prompts == "arith":
                tasks, envs, label = _tasks_and_envs(batch, 1)
                if label != "arith prompts":
                    raise SystemExit(f"--single-turn-prompts arith: {label}")
            else:
                envs = [_ScriptedToolEnv(1) for _ in range(batch)]
            tokens, seconds = _engine_run(model, tokenizer, args, envs, tasks, args.max_new_tokens, 1, seed=repeat)
            engine_rates.append(tokens / seconds)
            prompts = [chat_format.prompt_ids(e.reset(t), e.tool_schemas) for e, t in zip(envs, tasks)]
            torch.manual_seed(repeat)
            new, seconds = _generate(model, tokenizer, prompts, args.max_new_tokens, args.temperature)
            generate_rates.append(sum(len(n) for n in new) / seconds)
        rows += [
            _row(f"single-turn b={batch} engine[{args.runner}]", engine_rates),
            _row(f"single-turn b={batch} generate", generate_rates),
        ]
        ratios[f"single_b{batch}"] = statistics.median(engine_rates) / statistics.median(generate_rates)
    if args.multi_turn_episodes > 0:
        n, label = args.multi_turn_episodes, ""
        engine_rates, generate_rates = [], []
        for repeat in range(args.repeats):
            tasks, envs, label = _tasks_and_envs(n, args.turns)
            tokens, seconds = _engine_run(
                model, tokenizer, args, envs, tasks, args.turn_tokens, args.turns, seed=repeat
            )
            engine_rates.append(tokens / seconds)
            tasks, envs, _ = _tasks_and_envs(n, args.turns)
            torch.manual_seed(repeat)
            tokens, seconds = _generate_episodes(
                model, tokenizer, chat_format, envs, tasks, args.turn_tokens, args.turns, args.temperature
            )
            generate_rates.append(tokens / seconds)
        name = f"multi-turn {n}x{args.turns}x{args.turn_tokens}"
        rows += [
            _row(f"{name} engine[{args.runner}]", engine_rates),
            _row(f"{name} generate (re-encode)", generate_rates),
        ]
        ratios["multi_turn"] = statistics.median(engine_rates) / statistics.median(generate_rates)
        print(f"# multi-turn: {label}")
    print(f"{'row':<44} {'median tok/s':>12} {'min':>8} {'max':>8}")
    for row in rows:
        print(f"{row['row']:<44} {row['median']:>12.1f} {row['min']:>8.1f} {row['max']:>8.1f}")
    print(
        json.dumps(
            {
                "engine_over_generate": ratios,
                "runner": args.runner,
                "dtype": args.dtype,
                "repeats": args.repeats,
                "single_turn_prompts": args.single_turn_prompts,
            }
        )
    )


if __name__ == "__main__":
    main()
