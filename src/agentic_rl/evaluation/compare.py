"""Paired comparison of two evaluations of the same problems.

    agentic-rl compare runs/demo/eval_sft runs/demo/eval_grpo
    agentic-rl compare sft.json grpo.json            # files from `agentic-rl eval --out`
    agentic-rl compare sft.json s0.json s1.json s2.json   # several B (e.g. seeds) and their mean
    agentic-rl compare --a g0.json g1.json g2.json --b p0.json p1.json p2.json   # mean against mean

An input is an evaluation result (`eval --out FILE`), a pipeline stage's DONE.json, or the
stage's folder. A stage holds several evaluations (by label); every label present on both sides
is compared, on every per-problem metric both sides measured (pass@1; with k > 1 also the
sampled accuracy, pass@k and maj@k). Problems are paired by task id, and both sides must hold
exactly the same problems: comparing different problem sets is not a paired comparison.

With several B inputs (e.g. one GRPO run per seed), each is compared with A, and so is their mean:
per problem, the mean of the B outcomes (greedy pass@1), against A's. Its interval resamples
problems, not runs: with a handful of seeds, the spread between the per-seed rows is the larger
uncertainty. So one more row, "pass@1, runs as units", treats each input as one number (its
accuracy) and the runs as the sample: Student's t-interval of the per-seed differences against one
A, Welch's against several (evaluation/stats.py). That is the interval for a claim "over 3 seeds";
its "B higher / lower" column counts runs. With several A inputs (`--a`), A is their per-problem
mean in the same way: e.g. three PPO seeds against three GRPO seeds, run from the same start.

Where both sides recorded each episode's tool calls, one more row, "tool calls, both solved": B − A
in greedy tool calls on the problems both solved (all seeds of a mean), e.g. in `plan` the length
of the plan that reached the goal. "B better" is not said of it: its verdict is "B fewer" or "B more".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from agentic_rl.evaluation.runner import compared_metrics, per_problem_scores
from agentic_rl.evaluation.stats import paired_difference, run_level_difference
from agentic_rl.strict_json import read_json


def load_evaluations(path: str | Path) -> dict[str, dict[str, Any]]:
    """{label: evaluation result} from an eval result file, a stage DONE.json, or a stage folder."""
    path = Path(path)
    if path.is_dir():
        path = path / "DONE.json"
    if not path.exists():
        raise ValueError(
            f"{path}: no such file; give an `agentic-rl eval --out` file, a pipeline stage folder or its DONE.json"
        )
    payload = read_json(path, "give an `agentic-rl eval --out` file, a pipeline stage folder or its DONE.json")
    if isinstance(payload, dict) and isinstance(payload.get("evals"), dict):
        evaluations = payload["evals"]
    elif isinstance(payload, dict) and "per_task" in payload:
        evaluations = {payload.get("label") or payload.get("env", "eval"): payload}
    else:
        raise ValueError(
            f"{path}: holds no evaluation with per-problem results (no 'evals' or 'per_task' key); "
            "evaluations written before per-problem results were recorded cannot be paired: rerun them"
        )
    for label, result in evaluations.items():
        if "per_task" not in result:
            raise ValueError(f"{path}: evaluation '{label}' has no per-problem results ('per_task'); rerun it")
    return evaluations


def compare_evaluations(a: dict[str, Any], b: dict[str, Any], label: str = "") -> list[dict[str, Any]]:
    """One row per metric both evaluations support: B − A paired by task id, with its 95% CI."""
    ids_a, ids_b = a["per_task"]["id"], b["per_task"]["id"]
    if sorted(ids_a) != sorted(ids_b):
        only_a, only_b = sorted(set(ids_a) - set(ids_b)), sorted(set(ids_b) - set(ids_a))
        raise ValueError(
            f"evaluation '{label}': the two sides hold different problems ({len(ids_a)} and {len(ids_b)}; "
            f"only in A: {only_a[:3]}{'...' if len(only_a) > 3 else ''}, only in B: {only_b[:3]}{'...' if len(only_b) > 3 else ''}). "
            "Evaluate both models with the same env options, split, n and seed."
        )
    order_b = {task_id: index for index, task_id in enumerate(ids_b)}
    rows = []
    for metric in [m for m in compared_metrics(a) if m in compared_metrics(b)]:
        scores_a = per_problem_scores(a, metric)
        scores_b_by_id = per_problem_scores(b, metric)
        scores_b = [scores_b_by_id[order_b[task_id]] for task_id in ids_a]
        rows.append({"label": label, "metric": metric, **paired_difference(scores_a, scores_b).as_dict()})
    if "tool_calls" in a["per_task"] and "tool_calls" in b["per_task"]:
        rows += _tool_calls_when_solved(a, b, [order_b[task_id] for task_id in ids_a], label)
    return rows


TOOL_CALLS_SOLVED = "tool calls, both solved"
"""The metric of the plan-length row: mean greedy tool calls on the problems both sides solved."""


def _tool_calls_when_solved(
    a: dict[str, Any], b: dict[str, Any], b_index: list[int], label: str
) -> list[dict[str, Any]]:
    """B − A in tool calls per episode on the problems every episode of both sides solved (in
    `plan`, the length of the plan that reached the goal): [] when there are none. A mean
    evaluation (several seeds) counts a problem as solved when all its seeds solved it."""
    greedy_a, greedy_b = a["per_task"]["greedy"], b["per_task"]["greedy"]
    calls_a, calls_b = a["per_task"]["tool_calls"], b["per_task"]["tool_calls"]
    both = [(i, j) for i, j in enumerate(b_index) if greedy_a[i] == 1 and greedy_b[j] == 1]
    if not both:
        return []
    result = paired_difference([calls_a[i] for i, _ in both], [calls_b[j] for _, j in both])
    verdict = "B fewer" if result.ci_high < 0 else "B more" if result.ci_low > 0 else "within noise"
    return [{"label": label, "metric": TOOL_CALLS_SOLVED, **result.as_dict(), "verdict": verdict}]


def compare_paths(paths_a: Sequence[str | Path], paths_b: Sequence[str | Path]) -> list[dict[str, Any]]:
    """Compare every evaluation label all inputs share: A against each B (row "b": its path) and,
    with several B, against their per-problem mean (row "b": "mean of N"), then the run-level row
    (RUNS_AS_UNITS). With several A, the A side is their per-problem mean (row "a": "mean of N");
    with one, row "a" is its path."""
    if not paths_a or not paths_b:
        raise ValueError("compare needs at least one A input and one B input")
    lefts, rights = [load_evaluations(path) for path in paths_a], [load_evaluations(path) for path in paths_b]
    shared = [label for label in lefts[0] if all(label in side for side in lefts[1:] + rights)]
    if not shared:
        raise ValueError(f"{', '.join(map(str, paths_a))} and {', '.join(map(str, paths_b))} share no evaluation label")
    name_a = str(paths_a[0]) if len(lefts) == 1 else f"mean of {len(lefts)}"
    rows = []
    for label in shared:
        left = lefts[0][label] if len(lefts) == 1 else mean_evaluation([side[label] for side in lefts], label, "A")
        for path, right in zip(paths_b, rights):
            rows += [{"a": name_a, "b": str(path), **row} for row in compare_evaluations(left, right[label], label)]
        if len(rights) > 1:
            mean = mean_evaluation([right[label] for right in rights], label, "B")
            rows += [
                {"a": name_a, "b": f"mean of {len(rights)}", **row} for row in compare_evaluations(left, mean, label)
            ]
            accuracies_a = [_accuracy(side[label]) for side in lefts]
            accuracies_b = [_accuracy(side[label]) for side in rights]
            rows.append(
                {
                    "a": name_a,
                    "b": f"mean of {len(rights)}",
                    "label": label,
                    "metric": RUNS_AS_UNITS,
                    **run_level_difference(accuracies_a, accuracies_b).as_dict(),
                }
            )
    return rows


RUNS_AS_UNITS = "pass@1, runs as units"
"""The metric of the run-level row: each input's greedy accuracy is one sample (module docstring)."""


def _accuracy(evaluation: dict[str, Any]) -> float:
    scores = per_problem_scores(evaluation, "pass@1")
    return sum(scores) / len(scores)


def mean_evaluation(evaluations: list[dict[str, Any]], label: str = "", side: str = "B") -> dict[str, Any]:
    """An evaluation whose greedy outcome (and tool calls, where every input recorded them) per
    problem is the mean of `evaluations`' (same problems)."""
    ids = evaluations[0]["per_task"]["id"]
    for evaluation in evaluations:
        if sorted(evaluation["per_task"]["id"]) != sorted(ids):
            raise ValueError(
                f"evaluation '{label}': the {side} inputs hold different problems; evaluate them on the same ones"
            )
    keys = ["greedy"] + (["tool_calls"] if all("tool_calls" in e["per_task"] for e in evaluations) else [])
    per_task = {"id": list(ids)}
    for key in keys:
        by_id = [dict(zip(evaluation["per_task"]["id"], evaluation["per_task"][key])) for evaluation in evaluations]
        per_task[key] = [sum(values[i] for values in by_id) / len(by_id) for i in ids]
    return {"k": 1, "per_task": per_task}


def format_rows(rows: list[dict[str, Any]], name_a: str = "A", name_b: str = "B") -> list[str]:
    """A Markdown table of comparison rows (with a column naming B when the rows compare several)."""
    several = len({row.get("b") for row in rows}) > 1
    lines = [
        f"| evaluation |{' B |' if several else ''} metric | n | {name_a} | {name_b} | {name_b} − {name_a} [95% CI] | {name_b} higher / lower | McNemar p | verdict |",
        "|---|" + ("---|" if several else "") + "---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        p = "" if row["mcnemar_p"] is None else "< 0.001" if row["mcnemar_p"] < 0.001 else f"{row['mcnemar_p']:.3f}"
        b_cell = f" {row.get('b')} |" if several else ""
        value, change = (
            (".2f", "+.2f") if row["metric"] == TOOL_CALLS_SOLVED else (".1%", "+.1%")
        )  # a count, not an accuracy
        lines.append(
            f"| {row['label']} |{b_cell} {row['metric']} | {row['n']} | {row['mean_a']:{value}} | {row['mean_b']:{value}} | "
            f"{row['difference']:{change}} [{row['ci_low']:{change}}, {row['ci_high']:{change}}] | {row['b_better']} / {row['a_better']} | {p} | "
            f"{row['verdict'].replace('B', name_b).replace('A', name_a)} |"
        )
    return lines
