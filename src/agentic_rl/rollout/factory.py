"""Build a RolloutEngine for a model from a `RolloutConfig`: chat format, backend, limits, sampling.

    engine = build_engine(model, tokenizer, RolloutConfig(max_turn_tokens=128), seed=0)
    trajectories = engine.run(envs, tasks)

`backend="auto"` picks FastRunner for Llama/Qwen3 models and HFRunner, the reference, for anything
else, each behind `RunnerBackend`. After every weight update the trainer calls `engine.sync_weights()`.
"""

from __future__ import annotations

from typing import Any

import torch

from agentic_rl.models.chat_format import ChatFormat
from agentic_rl.models.precision import resolve_rollout_dtype
from agentic_rl.rollout.backend import RunnerBackend
from agentic_rl.rollout.config import BackendKind, RolloutConfig, RolloutDtype
from agentic_rl.rollout.engine import RolloutEngine
from agentic_rl.rollout.fast_kv_cache import CacheMemoryError
from agentic_rl.rollout.fast_runner import FastRunner
from agentic_rl.rollout.hf_runner import HFRunner


def build_runner(model: Any, kind: BackendKind, max_slots: int, max_len: int, dtype: RolloutDtype = "float32"):
    """FastRunner when asked for (or "auto" and the model is supported), else HFRunner.

    dtype="bfloat16" decodes from bf16 copies of the weights (FastRunner only): about 2x faster
    on CPUs with bf16 kernels, where decoding is bound by reading the weights. Sampling log-probs
    then come from bf16 weights, so trainers must not use them as π_old (see
    GRPOConfig.old_logprobs). dtype="auto": bfloat16 only where bf16 is fast (models/precision.py).
    """
    if dtype == "auto":
        dtype = resolve_rollout_dtype(dtype, next(model.parameters()).device)  # type: ignore[assignment]
        print(f"rollout.dtype: auto -> {dtype} on this machine (models/precision.py)", flush=True)
    else:
        resolve_rollout_dtype(dtype, next(model.parameters()).device)  # warns where bfloat16 is slow
    if kind in ("auto", "fast"):
        try:
            compute = torch.bfloat16 if dtype == "bfloat16" else torch.float32
            return FastRunner(model, max_slots=max_slots, max_len=max_len, dtype=compute)
        except NotImplementedError:
            if kind == "fast":
                raise
    if dtype != "float32":
        raise ValueError(
            f"rollout dtype {dtype} needs the fast runner, which does not support {type(model).__name__}; use float32"
        )
    return HFRunner(model, max_slots=max_slots, max_len=max_len)


def build_engine(
    model: Any,
    tokenizer: Any,
    cfg: RolloutConfig,
    *,
    seed: int,
    max_concurrent: int = 32,
    temperature: float | None = None,
) -> RolloutEngine:
    """A ready engine for `model`: `cfg`'s limits, sampling and backend; `max_concurrent` episodes
    decode at once (the backend's slots); `temperature` overrides cfg's (0: greedy)."""
    model.eval()
    chat_format = ChatFormat.for_tokenizer(tokenizer, cfg.enable_thinking)
    try:
        runner = build_runner(
            model, cfg.backend, max_slots=max_concurrent, max_len=cfg.max_episode_tokens, dtype=cfg.dtype
        )
    except CacheMemoryError as exc:
        raise CacheMemoryError(
            f"{exc}: it holds the {max_concurrent:,} episodes that decode at once (rollout.batch_size in training, "
            f"max_concurrent in eval and serve, n in audit) of up to rollout.max_episode_tokens={cfg.max_episode_tokens:,} tokens each. "
            "Lower either"
        ) from None
    return RolloutEngine(
        RunnerBackend(runner, chat_format),
        chat_format,
        tokenizer,
        cfg,
        cfg.sampling_params(seed, temperature),
        tool_workers=cfg.tool_workers,
    )
