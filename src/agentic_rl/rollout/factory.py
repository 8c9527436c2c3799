"""Build a RolloutEngine for a model: chat format, runner (fast when supported), limits, sampling.

    engine = build_engine(model, tokenizer, max_turn_tokens=128, temperature=1.0, seed=0)
    trajectories = engine.run(envs, tasks)

`runner="auto"` picks FastRunner for Llama/Qwen3 models (it must be refreshed after each weight
update: `refresh_engine_weights`), and HFRunner, the reference, for anything else.
"""

from __future__ import annotations

from typing import Any, Literal

from agentic_rl.models.chat_format import ChatFormat
from agentic_rl.rollout.engine import RolloutEngine, RolloutLimits
from agentic_rl.rollout.hf_runner import HFRunner
from agentic_rl.rollout.sampling import SamplingParams

RunnerKind = Literal["auto", "fast", "hf"]


RolloutDtype = Literal["float32", "bfloat16"]


def build_runner(model: Any, kind: RunnerKind, max_slots: int, max_len: int, dtype: RolloutDtype = "float32"):
    """FastRunner when asked for (or "auto" and the model is supported), else HFRunner.

    dtype="bfloat16" decodes from bf16 copies of the weights (FastRunner only): about 2x faster
    on CPU, where decoding is bound by reading the weights. Sampling log-probs then come from
    bf16 weights, so trainers must not use them as π_old (see GRPOConfig.old_logprobs).
    """
    import torch

    if kind in ("auto", "fast"):
        try:
            from agentic_rl.rollout.fast_runner import FastRunner

            compute = torch.bfloat16 if dtype == "bfloat16" else torch.float32
            return FastRunner(model, max_slots=max_slots, max_len=max_len, dtype=compute)
        except NotImplementedError:
            if kind == "fast":
                raise
    if dtype != "float32":
        raise ValueError(f"rollout dtype {dtype} needs the fast runner, which does not support {type(model).__name__}; use float32")
    return HFRunner(model, max_slots=max_slots, max_len=max_len)


def build_engine(
    model: Any,
    tokenizer: Any,
    max_turn_tokens: int = 128,
    max_episode_tokens: int = 1024,
    max_turns: int = 8,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    max_concurrent: int = 32,
    runner: RunnerKind = "auto",
    tool_workers: int = 4,
    dtype: RolloutDtype = "float32",
) -> RolloutEngine:
    """A ready engine for `model` (temperature 0 = greedy)."""
    model.eval()
    chat_format = ChatFormat.for_tokenizer(tokenizer)
    limits = RolloutLimits(max_turn_tokens=max_turn_tokens, max_episode_tokens=max_episode_tokens, max_turns=max_turns)
    sampling = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    model_runner = build_runner(model, runner, max_slots=max_concurrent, max_len=max_episode_tokens, dtype=dtype)
    return RolloutEngine(model_runner, chat_format, tokenizer, limits, sampling, tool_workers=tool_workers)


def refresh_engine_weights(engine: RolloutEngine) -> int:
    """After an optimizer step: re-read weights into the runner (FastRunner copies them) and
    bump the engine's weights version. Returns the new version."""
    refresh = getattr(engine.runner, "refresh_weights", None)
    if refresh is not None:
        refresh()
    return engine.bump_weights_version()
