"""The cost of the audit on start (training/start_audit.py, `audit.on_start`) against a step.

    TOKENIZERS_PARALLELISM=false .venv/bin/python benchmarks/audit_on_start.py [--repeats 7] [--steps 4]

Two measurements:
  * demo shape: the prefix and mask checks (the audit's part before the first gradient) on 32
    oracle episodes of the demo's GRPO env (arith difficulty 2, all seven stories) with SmolLM2's
    tokenizer, repeated; no model is needed. Set against the demo's GRPO step (51.6 s median,
    BENCHMARKS.md "PPO against GRPO"), which decodes and trains episodes of this shape.
  * tiny-qwen3: a GRPO run of `--steps` steps (batch 4, one turn of 8 tokens, the format reward,
    β = 0.04 so every step trains): the median of its step times (time/data + forward_backward +
    optimizer) after step 1, against the checks on its first batch, repeated (the run's own
    `time/audit`, checks and log-prob drift, one ~10 ms sample, is printed too).
The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

DEMO_STEP_SECONDS = 51.6
"""BENCHMARKS.md, "Record: PPO against GRPO": the demo's GRPO step, median of 4."""
STORIES = ["train", "garden", "warehouse", "shopping", "baking", "savings", "sharing"]


def demo_shape(repeats: int) -> dict[str, float]:
    from agentic_rl.envs.base import make_env
    from agentic_rl.models.chat_format import ChatFormat
    from agentic_rl.models.loader import load_tokenizer
    from agentic_rl.rollout.demos import oracle_demos
    from agentic_rl.training.start_audit import StartAudit

    chat_format = ChatFormat.for_tokenizer(load_tokenizer("smollm2-135m-instruct"))
    env = make_env("arith", difficulty=2, templates=STORIES)
    episodes = oracle_demos(env, env.tasks("train", n=32, seed=0), chat_format)
    times = []
    for _ in range(repeats):
        audit = StartAudit(chat_format, env.tool_schemas, float32_both_sides=True, log=lambda *_: None)
        started = time.perf_counter()
        assert audit.check_episodes(episodes) is None, "the oracle's episodes must pass"
        times.append(time.perf_counter() - started)
    median = statistics.median(times)
    print(
        f"demo shape: 32 episodes, {sum(e.num_turns for e in episodes)} turns, {sum(len(e) for e in episodes)} tokens: "
        f"checks {median:.3f} s, median of {repeats} [{min(times):.3f}, {max(times):.3f}] = "
        f"{100 * median / DEMO_STEP_SECONDS:.2f}% of the demo's {DEMO_STEP_SECONDS} s GRPO step",
        flush=True,
    )
    return {"demo_checks_s": median, "demo_share": median / DEMO_STEP_SECONDS}


def tiny_run(steps: int, repeats: int) -> dict[str, float]:
    from agentic_rl.config import load_config
    from agentic_rl.models.policy import load_policy
    from agentic_rl.training.common import make_accelerator
    from agentic_rl.training.grpo import GRPO, train_grpo
    from agentic_rl.training.grpo_config import GRPOConfig
    from agentic_rl.training.scoring import TokenScorer
    from agentic_rl.training.start_audit import StartAudit

    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(
            GRPOConfig,
            None,
            overrides=[
                "model.name=tiny-qwen3",
                "model.lora.r=4",
                "rollout.batch_size=4",
                "rollout.group_size=2",
                "rollout.max_turn_tokens=8",
                "rollout.max_turns=1",
                "env.options={difficulty: 1}",
                "env.task_pool=8",
                "rewards=[{name: format}]",
                "loss.beta=0.04",
                "micro_batch_size=4",
                "train.progress=false",
                f"train.steps={steps}",
                f"train.output_dir={out}",
            ],
        )
        rows = train_grpo(cfg)["history"]
    seconds = [row["time/data"] + row["time/forward_backward"] + row["time/optimizer"] for row in rows]
    logged, step = rows[0]["time/audit"], statistics.median(seconds[1:])
    # the run's single time/audit is a ~10 ms figure, at the mercy of the scheduler on a shared
    # machine: time the checks again, repeated, on the same first batch (same seed, same episodes)
    policy, tokenizer, _ = load_policy(cfg.model, log=lambda *_: None)
    objective = GRPO(cfg, tokenizer, None)
    objective.bind(TokenScorer(policy), make_accelerator("no", cfg.train.seed))
    episodes = objective.sampler.collate(*objective.sampler.draw(0)).trajectories
    times = []
    for _ in range(repeats):
        audit = StartAudit(
            objective.sampler.engine.chat_format,
            objective.sampler.env_for(objective.sampler.task_pool[0]).tool_schemas,
            True,
            log=lambda *_: None,
        )
        started = time.perf_counter()
        assert audit.check_episodes(episodes) is None
        times.append(time.perf_counter() - started)
    median = statistics.median(times)
    print(
        f"tiny-qwen3: checks {1e3 * median:.1f} ms, median of {repeats} [{1e3 * min(times):.1f}, {1e3 * max(times):.1f}] "
        f"(the run logged time/audit {1e3 * logged:.1f} ms, checks and drift); steps 2-{steps} {step:.2f} s median "
        f"[{min(seconds[1:]):.2f}, {max(seconds[1:]):.2f}]: {100 * median / step:.2f}% of a step",
        flush=True,
    )
    return {"tiny_checks_s": median, "tiny_logged_audit_s": logged, "tiny_step_s": step, "tiny_share": median / step}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    print(json.dumps({**demo_shape(args.repeats), **tiny_run(args.steps, args.repeats)}))


if __name__ == "__main__":
    main()
