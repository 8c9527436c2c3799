"""`agentic-rl audit`: check, for your model, template and environment, that training will see what
inference sees, before any GPU hour is spent.

    agentic-rl audit --model smollm2-135m-instruct --env arith --n 8

Four checks, each PASS or FAIL with its numbers; the first failing episode is shown token by token:

  template   Rendering the conversation one turn further keeps the earlier rendering as an exact
             token prefix, at every assistant turn of an oracle episode (the engine extends
             episodes incrementally, so a template that rewrites earlier turns, or a tokenizer
             that merges across the boundary, would make the trained tokens differ from what a
             re-rendering gives). Where not: the first token that differs. In an episode whose
             history is not a prefix (an env that drops old turns), within each token sequence:
             from its prompt (the env's context) on.
  mask       In sampled episodes, the tokens with loss mask 1 are exactly the model's turns: each
             masked run decodes to its assistant message (plus the end-of-turn marker the model
             generated), and nothing else is masked. Over every token sequence of the episode,
             oldest first, the masked runs are the episode's turns in order, each exactly once.
             Where not: the first bad token.
  logprobs   The sampler's log-probs against one training forward pass (fp32) over the same
             tokens (every token sequence of every episode), max and mean absolute difference,
             for each decode dtype asked for. float32 decoding must agree within `tolerance`;
             bfloat16 decoding is reported (its log-probs are not π_old: use old_logprobs detach
             or recompute).
  weights    After an update of the weights and `engine.sync_weights()`, the engine reports the
             trainer's version and its samples score like the updated model.

The pure checks (prefix, mask, log-prob drift) live in rollout/episode_checks.py: every GRPO
and PPO run also runs them on its first batch (training/start_audit.py, `audit.on_start`).

Shapes and names: T tokens of an episode; `mask` is the trajectory's loss mask.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch

from agentic_rl.envs.oracle import play_oracle
from agentic_rl.evaluation.config import AuditConfig
from agentic_rl.models.chat_format import ChatFormat
from agentic_rl.models.logprobs import sequence_logprobs
from agentic_rl.models.precision import decoded_dtype
from agentic_rl.rollout.episode_checks import (
    logprob_drift,
    mask_problem,
    mask_table,
    prefix_problem,
    token_table,
    turn_cuts,
)
from agentic_rl.rollout.factory import build_engine
from agentic_rl.rollout.trajectory import Trajectory, collate


@dataclasses.dataclass
class CheckResult:
    name: str
    passed: bool
    summary: str
    detail: list[str] = dataclasses.field(default_factory=list)
    """The first failure, token by token (empty when passed)."""


def run_audit(model: Any, tokenizer: Any, cfg: AuditConfig) -> list[CheckResult]:
    """Every check, in order. The model is not changed (the weights check works on a copy)."""
    chat_format = ChatFormat.for_tokenizer(tokenizer, cfg.rollout.enable_thinking)
    results = [check_template(chat_format, cfg)]
    device = next(model.parameters()).device
    dtypes = dict.fromkeys(decoded_dtype(dtype, device) for dtype in cfg.dtypes)
    trajectories = {dtype: _sample(model, tokenizer, cfg, dtype) for dtype in dtypes}
    results.append(check_masks(chat_format, [t for ts in trajectories.values() for t in ts]))
    results.append(check_logprobs(model, tokenizer, trajectories, cfg))
    results.append(check_weight_sync(model, tokenizer, cfg))
    return results


def format_report(results: list[CheckResult]) -> str:
    lines = []
    for result in results:
        lines.append(f"{'PASS' if result.passed else 'FAIL'}  {result.name:9s} {result.summary}")
        lines += [f"      {line}" for line in result.detail]
    return "\n".join(lines)


# ---------------------------------------------------------------------- template


def check_template(chat_format: ChatFormat, cfg: AuditConfig) -> CheckResult:
    """Each assistant-turn prefix of `cfg.n` oracle conversations renders as a token prefix of the next."""
    env = cfg.env.make()
    checked = 0
    for task in env.tasks(cfg.split, n=cfg.n, seed=cfg.seed):
        episode = play_oracle(env, task)
        for number, (messages, prompt) in enumerate(zip(episode.sequences, episode.sequence_prompts)):
            problem = prefix_problem(chat_format, messages, prompt, env.tool_schemas)
            if problem is not None:
                where = f"task {task.id}" + (f", token sequence {number}" if len(episode.sequences) > 1 else "")
                return CheckResult(
                    "template",
                    False,
                    (
                        f"{where}: rendering {problem.after} messages rewrites the rendering of the first {problem.before}; "
                        f"first differing token at position {problem.position}"
                    ),
                    token_table(chat_format, problem.shorter, problem.longer, problem.position),
                )
            checked += len(turn_cuts(messages, prompt)) - 1  # turn boundaries: pairs of consecutive renderings
    return CheckResult(
        "template", True, f"{checked} turn boundaries of {cfg.n} oracle episodes keep their prefix exactly"
    )


# ---------------------------------------------------------------------- masks


def check_masks(chat_format: ChatFormat, trajectories: list[Trajectory]) -> CheckResult:
    """Every masked run decodes to its assistant message, in order, and nothing else is masked."""
    turns = sequences = 0
    for trajectory in trajectories:
        problem = mask_problem(chat_format, trajectory)
        if problem is not None:
            number, position, message = problem
            where = f"task {trajectory.task_id}" + (f", token sequence {number}" if trajectory.previous else "")
            return CheckResult(
                "mask", False, f"{where}: {message}", mask_table(chat_format, trajectory.sequences()[number], position)
            )
        turns += sum(1 for m in trajectory.messages if m["role"] == "assistant")
        sequences += len(trajectory.previous) + 1
    over = f" in {sequences} token sequences" if sequences > len(trajectories) else ""
    return CheckResult(
        "mask",
        True,
        f"{len(trajectories)} sampled episodes: the masked tokens are exactly their {turns} model turns{over}",
    )


# ---------------------------------------------------------------------- log-probs and weights


def _sample(model: Any, tokenizer: Any, cfg: AuditConfig, dtype: str, seed_offset: int = 0) -> list[Trajectory]:
    rollout = dataclasses.replace(cfg.rollout, dtype=dtype)
    engine = build_engine(model, tokenizer, rollout, seed=cfg.seed + seed_offset, max_concurrent=cfg.n)
    tasks = cfg.env.make().tasks(cfg.split, n=cfg.n, seed=cfg.seed)
    with torch.no_grad():
        return engine.run([cfg.env.make() for _ in tasks], tasks)


def logprob_gaps(model: Any, tokenizer: Any, trajectories: list[Trajectory], temperature: float) -> torch.Tensor:
    """|sampler log-prob − training forward log-prob| at every masked token of every token sequence
    of `trajectories` (1-D, float64)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    batch = collate([sequence for trajectory in trajectories for sequence in trajectory.sequences()], pad)
    batch = batch.to(next(model.parameters()).device)  # rollout.device (on the CPU this is a no-op)
    with torch.no_grad():
        logps, _ = sequence_logprobs(
            model, batch.input_ids, batch.attention_mask, batch.loss_mask, temperature=temperature
        )
    return logprob_drift(logps, batch.logprobs, batch.loss_mask)


def check_logprobs(
    model: Any, tokenizer: Any, trajectories: dict[str, list[Trajectory]], cfg: AuditConfig
) -> CheckResult:
    parts, passed = [], True
    for dtype, trajs in trajectories.items():
        gaps = logprob_gaps(model, tokenizer, trajs, cfg.rollout.sampling.temperature)
        ok = dtype != "float32" or float(gaps.max()) <= cfg.tolerance
        passed &= ok
        parts.append(
            f"{dtype} decode: max {float(gaps.max()):.2e}, mean {float(gaps.mean()):.2e} over {gaps.numel()} tokens"
            + ("" if dtype == "float32" else " (not π_old: use old_logprobs detach or recompute)")
        )
    summary = "; ".join(parts) + f" (float32 must stay within {cfg.tolerance:g})"
    return CheckResult("logprobs", passed, summary)


def check_weight_sync(model: Any, tokenizer: Any, cfg: AuditConfig) -> CheckResult:
    """Update a copy of the weights as an optimizer step would, sync, and check the version and the samples."""
    trained = copy.deepcopy(model).float()
    rollout = dataclasses.replace(cfg.rollout, dtype="float32")
    engine = build_engine(trained, tokenizer, rollout, seed=cfg.seed, max_concurrent=cfg.n)
    tasks = cfg.env.make().tasks(cfg.split, n=cfg.n, seed=cfg.seed)
    generator = torch.Generator().manual_seed(cfg.seed)
    with torch.no_grad():
        for parameter in trained.parameters():  # one "optimizer step": every weight moves by ~1%
            noise = torch.randn(
                parameter.shape, generator=generator, dtype=parameter.dtype
            )  # drawn on the CPU: the same on any device
            parameter.mul_(1.0 + 0.01 * noise.to(parameter.device))
    version = engine.sync_weights()
    with torch.no_grad():
        after = engine.run([cfg.env.make() for _ in tasks], tasks)
    gaps = logprob_gaps(trained, tokenizer, after, cfg.rollout.sampling.temperature)
    stamped = {t.weights_version for t in after}
    passed = version == 1 and stamped == {1} and float(gaps.max()) <= cfg.tolerance
    return CheckResult(
        "weights",
        passed,
        (
            f"after 1 update the engine reports version {version}, its episodes carry {sorted(stamped)}; their log-probs "
            f"against the updated model: max gap {float(gaps.max()):.2e}"
        ),
    )
