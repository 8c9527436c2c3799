"""Seconds per GRPO step: our trainer against TRL 1.16's GRPOTrainer, side by side, in one run.

    .venv/bin/python benchmarks/grpo_step.py [--settings lora full] [--rounds 2] [--steps 2] [--warmup 1]

Both sides: SmolLM2-135M-Instruct, fp32, single-turn `arith` episodes (rollout.max_turns = 1, the
same prompts rendered by our chat format), 2 prompts x G = 4, 64 new tokens at most, beta = 0.04,
the accuracy reward, one optimizer step per batch, micro-batch = the whole batch of 8.
TRL goes through our `backend: trl` mapping (the same GRPOConfig), so its settings are ours.

Equal work: TRL is forced to generate exactly 64 tokens per completion (generation_kwargs
min_new_tokens = 64). Our engine cannot be forced (its stop rules live in rollout code we do not
touch here), so we report each side's generated tokens per step and a normalised ratio that scales
our step time to TRL's token count (an upper bound on our time: only part of a step scales with tokens).

Interleaving: rounds of [ours block, TRL block] per setting (A/B/A/B), each block `warmup` unmeasured
steps then `steps` measured steps, on a freshly built trainer. Ours: step time = time/data +
time/forward_backward + time/optimizer from its metrics; TRL: a TrainerCallback's
on_step_begin -> on_step_end. Reported: median, min, max over the measured steps of all rounds.

The last line printed is JSON: {"lora": TRL/ours, "full": TRL/ours, ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from agentic_rl.algorithms.grpo import GRPOLossConfig  # noqa: E402
from agentic_rl.models.lora import LoraConfig  # noqa: E402
from agentic_rl.rewards.base import RewardSpec  # noqa: E402
from agentic_rl.models.policy import ModelConfig  # noqa: E402
from agentic_rl.training.grpo import train_grpo  # noqa: E402
from agentic_rl.training.episode_config import EnvConfig  # noqa: E402
from agentic_rl.training.grpo_config import GRPOConfig, GRPORolloutConfig  # noqa: E402
from agentic_rl.training.loop import LoopConfig, OptimConfig  # noqa: E402

MODEL = "smollm2-135m-instruct"
NEW_TOKENS = 64
PROMPTS, G = 2, 4
BETA = 0.04
MATMUL_FLOPS = 169e9  # measured fp32 matmul throughput of this machine (BENCHMARKS.md)


def make_cfg(setting: str, steps: int, out: str, backend: str) -> GRPOConfig:
    return GRPOConfig(
        backend=backend,
        model=ModelConfig(name=MODEL, dtype="float32", lora=LoraConfig(enabled=setting == "lora")),
        env=EnvConfig(name="arith", options={"difficulty": 2, "max_turns": 1}, task_pool=64),
        rewards=[RewardSpec("accuracy")],
        rollout=GRPORolloutConfig(batch_size=PROMPTS * G, group_size=G, max_turn_tokens=NEW_TOKENS, max_turns=1),
        loss=GRPOLossConfig(beta=BETA),
        micro_batch_size=PROMPTS * G,
        optim=OptimConfig(lr=1e-5 if setting == "full" else 1e-4),
        train=LoopConfig(steps=steps, output_dir=out, progress=False, resume=False),
    )


def run_ours(setting: str, warmup: int, steps: int) -> tuple[list[float], list[float], list[dict]]:
    with tempfile.TemporaryDirectory() as out:
        history = train_grpo(make_cfg(setting, warmup + steps, out, "agentic_rl"))["history"]
    rows = history[warmup:]
    times = [r["time/data"] + r["time/forward_backward"] + r["time/optimizer"] for r in rows]
    tokens = [r["rollout/completion_tokens/mean"] * PROMPTS * G for r in rows]
    return times, tokens, rows


class StepTimer(TrainerCallback):
    def __init__(self):
        self.times, self.started = [], None

    def on_step_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self.started)


def run_trl(setting: str, warmup: int, steps: int) -> tuple[list[float], list[float], dict]:
    from agentic_rl.integrations.trl_backend import build_trl_trainer

    timer = StepTimer()
    with tempfile.TemporaryDirectory() as out:
        trainer, info = build_trl_trainer(
            make_cfg(setting, warmup + steps, out, "trl"),
            callbacks=[timer],
            extra_args={"generation_kwargs": {"min_new_tokens": NEW_TOKENS}},
        )
        trainer.train()
    rows = [r for r in trainer.state.log_history if "completions/mean_length" in r]
    tokens = [r["completions/mean_length"] * PROMPTS * G for r in rows][warmup:]
    return timer.times[warmup:], tokens, info


def flop_floor(setting: str, prompt_tokens: float, new_tokens: float) -> dict[str, float]:
    """FLOP floor of one step at 169 GFLOP/s fp32 (N = matmul parameters incl. the LM head).

    Counted over the step's U distinct tokens: each prompt once (its G episodes share it, and a
    trainer that runs a shared prefix once needs no more), plus every generated token:
    U = (B/G)·P + B·C. Rollout (prefill + decode), reference forward and policy forward: 2·N·U
    each; backward: 4·N·U for full fine-tuning (weight + activation gradients), 2·N·U with LoRA
    (activation gradients only; LoRA's own matmuls are negligible). B = 8, C = generated tokens
    per episode, P = prompt tokens.
    """
    h, inter, layers, vocab = 576, 1536, 30, 49152
    n = (
        layers * (2 * h * h + 2 * h * (h // 3) + 3 * h * inter) + h * vocab
    )  # q,o: h*h; k,v: h*h/3 (GQA 9:3); MLP; LM head
    distinct = PROMPTS * prompt_tokens + PROMPTS * G * new_tokens
    backward = (4 if setting == "full" else 2) * n * distinct
    total = 2 * n * distinct * 3 + backward
    return {"params": n, "flops": total, "seconds": total / MATMUL_FLOPS}


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} [{min(values):5.2f}, {max(values):5.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--settings", nargs="+", default=["lora", "full"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2, help="measured steps per block")
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args()
    results, ratios = {}, {}
    for setting in args.settings:
        ours_t, ours_tok, trl_t, trl_tok, profile = [], [], [], [], []
        for round_ in range(args.rounds):
            t, tok, rows = run_ours(setting, args.warmup, args.steps)
            ours_t += t
            ours_tok += tok
            profile += rows
            print(f"[{setting} round {round_}] ours  {['%.2f' % x for x in t]} s, tokens {tok}", flush=True)
            t, tok, info = run_trl(setting, args.warmup, args.steps)
            trl_t += t
            trl_tok += tok
            print(f"[{setting} round {round_}] trl   {['%.2f' % x for x in t]} s, tokens {tok}", flush=True)
        ours_med, trl_med = statistics.median(ours_t), statistics.median(trl_t)
        ours_tok_med, trl_tok_med = statistics.median(ours_tok), statistics.median(trl_tok)
        phases = {
            k: statistics.median(r[k] for r in profile)
            for k in ("time/rollout", "time/reference", "time/forward_backward", "time/optimizer", "time/data")
        }
        results[setting] = dict(ours=ours_t, trl=trl_t, ours_tokens=ours_tok_med, trl_tokens=trl_tok_med, phases=phases)
        ratios[setting] = trl_med / ours_med
        ratios[f"{setting}_token_normalised"] = trl_med / (ours_med * trl_tok_med / max(ours_tok_med, 1))
    from agentic_rl.envs.base import make_env
    from agentic_rl.models import load_tokenizer
    from agentic_rl.models.chat_format import ChatFormat

    env = make_env("arith", difficulty=2, max_turns=1)
    chat = ChatFormat(load_tokenizer(MODEL))
    prompt_len = statistics.mean(
        len(chat.prompt_ids(env.reset(t), env.tool_schemas)) for t in env.tasks("train", n=64, seed=0)
    )
    print()
    print(
        f"GRPO step, SmolLM2-135M-Instruct fp32, {PROMPTS} prompts x G={G}, <= {NEW_TOKENS} new tokens, beta={BETA}, "
        f"CPU threads={torch.get_num_threads()}, mean prompt {prompt_len:.0f} tokens"
    )
    print("| setting | side | s/step median [min, max] | gen tokens/step (median) | FLOP floor s/step |")
    print("|---|---|---|---|---|")
    for setting, r in results.items():
        for side in ("ours", "trl"):
            toks = r[f"{side}_tokens"]
            floor = flop_floor(setting, prompt_len, toks / (PROMPTS * G))
            print(f"| {setting} | {side} | {summary(r[side])} | {toks:.0f} | {floor['seconds']:.2f} |")
        print(
            f"| {setting} | ours phases (median s) | "
            + ", ".join(f"{k[5:]}={v:.2f}" for k, v in r["phases"].items())
            + " | | |"
        )
    print(
        f"N (matmul params) = {flop_floor('full', prompt_len, NEW_TOKENS)['params'] / 1e6:.1f} M; floor = "
        "[2N·U rollout + 2N·U reference + 2N·U policy + (4N full | 2N LoRA)·U backward] / 169 GFLOP/s, U = prompts·P + B·C distinct tokens"
    )
    print(json.dumps({k: round(v, 3) for k, v in ratios.items()}))


if __name__ == "__main__":
    main()
