"""Evaluate a model on an environment: greedy pass@1, sampled pass@k / maj@k, and statistics.

    agentic-rl eval --model smollm2-135m-instruct --env arith --n 48 --k 4 --json
    agentic-rl eval --config my-eval.yaml --set rollout.dtype=bfloat16     (every key: agentic-rl config eval)

Episodes run through the rollout engine, the same multi-turn tool loop as training. Greedy
decoding gives pass@1; with k > 1, k more episodes per problem are sampled (at
`rollout.sampling.temperature`, flag `--temperature`) for the unbiased pass@k and maj@k. Reported
alongside: format-error rate (no parseable final answer), mean policy tokens, tool calls per
episode and their success rate, accuracy by difficulty (arith) or by number of solution steps
(GSM8K), the mean of each named part of the env's reward (`reward_terms`: a verifiers rubric's
functions), and a few failed transcripts.

Per problem (`per_task`, for `agentic-rl compare`): the task id, the greedy outcome (1/0), the
greedy episode's tool calls (in `plan`, the actions it took: its plan's length), and with k > 1
the sampled correct count and majority-vote outcome (none in an env without final answers, such as
`plan`: `Env.final_answers`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from tqdm.auto import tqdm

from agentic_rl.envs.answer import answers_match, to_fraction
from agentic_rl.evaluation.config import EvalConfig
from agentic_rl.evaluation.metrics import maj_at_k, mean, pass_at_k
from agentic_rl.evaluation.stats import accuracy_interval
from agentic_rl.models.precision import decoded_dtype
from agentic_rl.rewards.terms import solution_steps
from agentic_rl.rollout.factory import build_engine
from agentic_rl.rollout.trajectory import Trajectory


def evaluate(model: Any, tokenizer: Any, cfg: EvalConfig, progress: bool = True) -> dict[str, Any]:
    """Run the evaluation; returns a flat dict of metrics plus "failures" (transcripts) and
    "decoded_in": the precision the episodes were decoded in (rollout.dtype, auto resolved)."""
    env = cfg.env.make()
    tasks = env.tasks(cfg.split, n=cfg.n, seed=cfg.seed)
    greedy = _run(model, tokenizer, cfg, tasks, temperature=0.0, desc=f"eval {cfg.name} greedy", progress=progress)
    result = episode_statistics(greedy, tasks)
    result["n"] = len(tasks)
    per_task: dict[str, list] = {
        "id": [t.id for t in tasks],
        "greedy": [int(bool(t.info.get("correct"))) for t in greedy],
        "tool_calls": [int(t.info.get("tool_calls", 0)) for t in greedy],
    }
    if cfg.k > 1:
        repeated = [t for t in tasks for _ in range(cfg.k)]
        sampled = _run(
            model,
            tokenizer,
            cfg,
            repeated,
            temperature=cfg.rollout.sampling.temperature,
            desc=f"eval {cfg.name} k={cfg.k}",
            progress=progress,
        )
        metrics, per_task["correct_of_k"], maj = sampled_metrics(sampled, tasks, cfg.k, vote=env.final_answers)
        if maj is not None:
            per_task["maj"] = maj
        result.update(metrics)
    result["k"] = cfg.k
    result["decoded_in"] = decoded_dtype(cfg.rollout.dtype, next(model.parameters()).device)
    result["per_task"] = per_task
    result["ci95"] = confidence_intervals(per_task, cfg.k)
    result["failures"] = [transcript(t) for t in greedy if not t.info.get("correct")][: cfg.failures_shown]
    return result


def per_problem_scores(result: dict[str, Any], metric: str) -> list[float]:
    """One score per problem, in task order, from an evaluation result's `per_task` record.

    metric: "pass@1" (greedy, 0/1), "sampled_accuracy@T" (c/k), "pass@k" (1 if any of the k
    samples is correct, 0 else; the k of the evaluation), "maj@k" (the tie-aware majority vote; only
    where the env has final answers)."""
    per_task, k = result["per_task"], int(result.get("k", 1))
    supported = compared_metrics(result)
    if metric not in supported:
        raise ValueError(f"unknown metric {metric!r} for this evaluation (k = {k}); use {', '.join(supported)}")
    if metric == "pass@1":
        return [float(v) for v in per_task["greedy"]]
    if metric == "sampled_accuracy@T":
        return [c / k for c in per_task["correct_of_k"]]
    if metric.startswith("pass@"):
        return [float(c > 0) for c in per_task["correct_of_k"]]
    return [float(v) for v in per_task["maj"]]


def compared_metrics(result: dict[str, Any]) -> list[str]:
    """The per-problem metrics an evaluation result supports, greedy first (maj@k only where the
    episodes had final answers to vote on)."""
    k = int(result.get("k", 1))
    if k == 1:
        return ["pass@1"]
    return ["pass@1", "sampled_accuracy@T", f"pass@{k}"] + ([f"maj@{k}"] if "maj" in result["per_task"] else [])


def confidence_intervals(per_task: dict[str, list], k: int) -> dict[str, list[float]]:
    """95% interval of every per-problem accuracy (see evaluation/stats.py for the methods)."""
    result = {"per_task": per_task, "k": k}
    return {metric: list(accuracy_interval(per_problem_scores(result, metric))) for metric in compared_metrics(result)}


def _run(model, tokenizer, cfg: EvalConfig, tasks, temperature: float, desc: str, progress: bool) -> list[Trajectory]:
    engine = build_engine(
        model, tokenizer, cfg.rollout, seed=cfg.seed, max_concurrent=cfg.max_concurrent, temperature=temperature
    )
    out: list[Trajectory] = []
    for start in tqdm(range(0, len(tasks), cfg.max_concurrent), desc=desc, disable=not progress):
        chunk = tasks[start : start + cfg.max_concurrent]
        out.extend(engine.run([cfg.env.make() for _ in chunk], chunk, seed=cfg.seed + start))
    return out


TRUNCATED = ("max_episode_tokens", "max_turn_tokens", "max_turns")
"""Finish reasons of an episode a rollout limit cut off."""


def episode_statistics(trajs: list[Trajectory], tasks: list) -> dict[str, Any]:
    """pass@1 and the per-episode statistics of one episode per task."""
    calls = [t.info.get("tool_calls", 0) for t in trajs]
    errors = [t.info.get("tool_errors", 0) for t in trajs]
    result: dict[str, Any] = {
        "pass@1": mean([float(bool(t.info.get("correct"))) for t in trajs]),
        "format_error_rate": mean([float(not t.info.get("format_ok")) for t in trajs]),
        "mean_tokens": mean([t.num_policy_tokens for t in trajs]),
        "tool_calls_per_episode": mean(calls),
        "tool_success_rate": (sum(calls) - sum(errors)) / sum(calls) if sum(calls) else float("nan"),
        "failed_episodes": sum(t.finish_reason == "error" for t in trajs),
        "finish_reasons": {
            reason: count / len(trajs) for reason, count in sorted(Counter(t.finish_reason for t in trajs).items())
        },
    }
    # cut off by a rollout limit (max_episode_tokens, max_turn_tokens, max_turns) before they could
    # finish: a high share means the limits, not the model, decide the accuracy
    result["truncated_rate"] = sum(share for reason, share in result["finish_reasons"].items() if reason in TRUNCATED)
    reported = [t.info.get("reward_terms") or {} for t in trajs]
    names = list(dict.fromkeys(name for terms in reported for name in terms))
    if names:  # the env's named reward parts (Env.reward_terms: a verifiers rubric's functions), each a mean
        result["reward_terms"] = {name: mean([float(terms.get(name, 0.0)) for terms in reported]) for name in names}
    with_steps = [t for t in trajs if t.info.get("solution_steps_total")]
    if with_steps:  # the mean share of reference intermediate results reproduced, in order
        result["solution_steps"] = mean([solution_steps(t) for t in with_steps])
    by_group: dict[str, list[float]] = defaultdict(list)
    for traj, task in zip(trajs, tasks):
        key = _difficulty_key(task)
        if key is not None:
            by_group[key].append(float(bool(traj.info.get("correct"))))
    for key in sorted(by_group):
        result[f"accuracy/{key}"] = mean(by_group[key])
    return result


def _difficulty_key(task) -> str | None:
    if "difficulty" in task.meta:
        return f"difficulty_{task.meta['difficulty']}"
    if "n_steps" in task.meta:
        return f"steps_{task.meta['n_steps']}"
    return None


def sampled_metrics(
    trajs: list[Trajectory], tasks: list, k: int, vote: bool = True
) -> tuple[dict[str, float], list[int], list[float] | None]:
    """pass@k, maj@k, the mean sampled accuracy, and the success histogram from k sampled
    episodes per task (tasks in order, k consecutive each); also the per-task correct counts
    and majority-vote scores. vote=False (an env without final answers): no maj@k, and None for
    its scores."""
    pass_k, maj_k, counts = [], [], []
    for index, task in enumerate(tasks):
        group = trajs[index * k : (index + 1) * k]
        correct = sum(bool(t.info.get("correct")) for t in group)
        counts.append(correct)
        pass_k.append(pass_at_k(k, correct, k))
        answers = [t.info.get("final_answer") for t in group]
        maj_k.append(maj_at_k(answers, lambda a, ref=task.answer: answers_match(a, ref), canonical=_canonical))
    metrics = {
        f"pass@{k}": mean(pass_k),
        "sampled_accuracy@T": mean([float(bool(t.info.get("correct"))) for t in trajs]),
        # how many problems the policy never / sometimes / always solves in k samples: only
        # "sometimes" problems give GRPO a group with reward variance
        "solved/never": sum(c == 0 for c in counts),
        "solved/sometimes": sum(0 < c < k for c in counts),
        "solved/always": sum(c == k for c in counts),
    }
    if not vote:
        return metrics, counts, None
    metrics[f"maj@{k}"] = mean(maj_k)
    return metrics, counts, maj_k


def _canonical(answer: str) -> str:
    value = to_fraction(answer)
    return str(value) if value is not None else answer.strip()


def transcript(traj: Trajectory) -> dict[str, Any]:
    """A failure as a readable record: the task, the answer given (or, for an episode the env or a tool
    broke, the exception's type and message: `error`) and the whole conversation."""
    return {
        "task_id": traj.task_id,
        "finish_reason": traj.finish_reason,
        "final_answer": traj.info.get("final_answer"),
        "reference": traj.info.get("reference"),
        "error": traj.info.get("error"),
        "messages": traj.messages,
    }
