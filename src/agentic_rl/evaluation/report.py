"""The pipeline report: report.md opens with its verdict (one line per compared pair of stages
and evaluation: each stage against the one it started from, and the RL stage against the
compute-matched control), then a metrics table per stage, the paired comparisons in full,
summary.json, plus PNG plots. What the run did not measure is left out: the sampled columns when
every evaluation is greedy only (k = 1), the KL chart when no KL was logged (β = 0 skips the
reference pass).

    summary.json   per stage and evaluation: n, each accuracy with its 95% interval, the
                   success histogram (k > 1 only); and the paired differences (B − A, 95% CI,
                   McNemar p) of each stage against the one it started from, and of GRPO against
                   the compute-matched SFT control

    plots/reward_components.png    RL reward per step, one line per component
    plots/accuracy_by_stage.png    pass@1 of each evaluation at base / SFT / GRPO
    plots/accuracy_by_minutes.png  pass@1 of each evaluation against training minutes: SFT, then
                                   the RL stage and the compute-matched control from SFT's end
    plots/length_and_variance.png  mean completion length and the share of groups with reward
                                   variance (the groups that carry a gradient) per RL step
    plots/kl.png                   KL to the reference per RL step, only when it was logged (β > 0)
    plots/mismatch.png             the sampler/trainer mismatch KL per RL step, only where it is
                                   above rounding (rollouts decoded in other numerics than training)
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from agentic_rl.strict_json import write_json
from agentic_rl.training.metric_keys import describe_metric
from agentic_rl.training.metrics_file import read_metrics

_STAGE_NAMES = {
    "eval_base": "base",
    "eval_sft": "after SFT",
    "eval_grpo": "after GRPO",
    "eval_ppo": "after PPO",
    "eval_control": "SFT control",
}
_COLUMNS = ("format_error_rate", "truncated_rate", "mean_tokens", "tool_calls_per_episode", "tool_success_rate")
COMPARISONS = (
    ("eval_base", "eval_sft"),
    ("eval_sft", "eval_grpo"),
    ("eval_sft", "eval_ppo"),
    ("eval_sft", "eval_control"),
    ("eval_control", "eval_grpo"),
    ("eval_control", "eval_ppo"),
)
"""(A, B) stage pairs the report compares, B − A: each stage against the one it started from,
and the RL stage (GRPO or PPO) against the compute-matched control."""
PLOTTED_METRICS = (
    "reward/{term}/mean",
    "loss/kl",
    "rollout/mismatch_kl",
    "rollout/completion_tokens/mean",
    "rollout/groups_with_variance",
    "train/groups_with_variance",
)
"""The RL metrics the plots show; the report defines each it plotted under the plots (training/metric_keys.py)."""

MISMATCH_SHOWN_ABOVE = 1e-8
"""The mismatch KL (rollout/mismatch_kl, nats per token) gets its chart when some step logged more:
float32 on both sides reads ~1e-13 (k3 of rounding-sized log-prob gaps, ~4e-7 nats on tiny-qwen3;
exactly 0 with old_logprobs: sampling); bf16 rollouts of tiny-qwen3 ~2e-7 (gaps of ~6e-4 nats)."""

REPORT_NAME = "report.md"
"""The report's file name in the run directory."""


def write_report(root: Path, results: dict[str, Any], cfg: Any) -> Path:
    """Write report.md, results.json, summary.json and plots/ under `root`; returns the report path."""
    import matplotlib  # local: torch-free

    matplotlib.use("Agg")
    plots = root / "plots"
    plots.mkdir(exist_ok=True)
    lines = ["# agentic-rl pipeline report", "", f"Base model: `{cfg.model}`. Run directory: `{root}`.", ""]
    summary = summarize(results)
    lines += verdict_lines(summary["comparisons"])
    lines += _eval_table(results)
    lines += _comparison_lines(summary["comparisons"])
    lines += _stage_table(results)
    rl_metrics = next(
        (root / name / "metrics.jsonl" for name in ("grpo", "ppo") if (root / name / "metrics.jsonl").exists()), None
    )
    if rl_metrics is not None:
        lines += _rl_plots(rl_metrics, plots)
    if _plot_accuracy(results, plots / "accuracy_by_stage.png"):
        lines += ["![accuracy by stage](plots/accuracy_by_stage.png)"]
    series = minutes_series(results)
    if plot_minutes(series, plots / "accuracy_by_minutes.png"):
        lines += ["![accuracy against training minutes](plots/accuracy_by_minutes.png)"]
    else:
        (plots / "accuracy_by_minutes.png").unlink(
            missing_ok=True
        )  # an earlier report's plot would describe another run
    failures = _failures(results)
    if failures:
        lines += ["", "## Sample failures after the last evaluated stage", ""] + failures
    write_json(root / "results.json", results)
    write_json(root / "summary.json", summary)
    report = root / REPORT_NAME
    report.write_text("\n".join(lines) + "\n")
    return report


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """The machine-readable summary: accuracies with 95% intervals per stage and evaluation (and
    the precision that decoded it, where recorded), and the paired comparisons of COMPARISONS on
    every evaluation both stages ran."""
    from agentic_rl.evaluation.compare import compare_evaluations  # local: torch-free
    from agentic_rl.evaluation.runner import compared_metrics  # local: torch-free

    stages: dict[str, Any] = {}
    for stage in _STAGE_NAMES:
        for label, metrics in (results.get(stage, {}).get("evals") or {}).items():
            entry: dict[str, Any] = {"n": metrics.get("n"), "k": metrics.get("k", 1)}
            for metric in compared_metrics(metrics) if "per_task" in metrics else ["pass@1"]:
                entry[metric] = {"value": metrics.get(metric), "ci95": (metrics.get("ci95") or {}).get(metric)}
            entry.update(
                {
                    key: metrics[key]
                    for key in ("solved/never", "solved/sometimes", "solved/always", "decoded_in")
                    if key in metrics
                }
            )
            stages.setdefault(stage, {})[label] = entry
    comparisons = []
    for a, b in COMPARISONS:
        left, right = (results.get(a) or {}).get("evals") or {}, (results.get(b) or {}).get("evals") or {}
        for label in [label for label in left if label in right]:
            if "per_task" in left[label] and "per_task" in right[label]:
                comparisons += [
                    {"a": a, "b": b, **row} for row in compare_evaluations(left[label], right[label], label)
                ]
    return {"stages": stages, "comparisons": comparisons}


def _eval_table(results: dict[str, Any]) -> list[str]:
    evaluated = [
        (stage, name, label, metrics)
        for stage, name in _STAGE_NAMES.items()
        for label, metrics in (results.get(stage, {}).get("evals") or {}).items()
    ]
    sampled = any(metrics.get("k", 1) > 1 for *_, metrics in evaluated)  # k = 1 everywhere: nothing was sampled
    header = "| evaluation | stage | n | pass@1 (greedy) |" + (
        " sampled accuracy | pass@k | maj@k | never / sometimes / always solved |" if sampled else ""
    )
    lines = [
        "## Evaluation",
        "",
        "Accuracies with their 95% intervals (Wilson for greedy pass@1"
        + (", a bootstrap over problems for the sampled ones)." if sampled else ")."),
        "",
        header + " " + " | ".join(_COLUMNS) + " | extra |",
        "|---|---|---|---|" + ("---|" * 4 if sampled else "") + "---|" * (len(_COLUMNS) + 1),
    ]
    for stage, name, label, metrics in evaluated:
        k = metrics.get("k", 1)
        keys = ("pass@1", "sampled_accuracy@T", f"pass@{k}", f"maj@{k}") if sampled else ("pass@1",)
        accuracies = [_with_ci(metrics, key) for key in keys]
        if sampled:
            accuracies.append(
                " / ".join(str(metrics[key]) for key in ("solved/never", "solved/sometimes", "solved/always"))
                if "solved/never" in metrics
                else ""
            )
        cells = [_fmt(metrics.get(column)) for column in _COLUMNS]
        extra = ", ".join(
            [f"{k} {_fmt(v)}" for k, v in metrics.items() if k.startswith(("accuracy/", "solution_steps"))]
            + ([f"decoded in {metrics['decoded_in']}"] if "decoded_in" in metrics else [])
        )
        lines.append(
            f"| {label} | {name} | {metrics.get('n', '')} | "
            + " | ".join(accuracies)
            + " | "
            + " | ".join(cells)
            + f" | {extra} |"
        )
    return lines


_VERDICT_WORDS = {"B better": "better", "A better": "worse", "within noise": "within noise"}
"""compare's verdict on B − A (stats.PairedDifference.verdict) as the verdict line says it of B."""


def verdict_lines(comparisons: list[dict[str, Any]]) -> list[str]:
    """The report's opening: one line per compared pair of stages and evaluation label
    (COMPARISONS order), on greedy pass@1: both accuracies, B − A with its 95% interval, compare's
    verdict and the McNemar p, e.g. "after GRPO against after SFT, new-stories: 75.0% against
    25.0%, +50.0 points [+35.0, +65.0], better (p < 0.001)"."""
    lines = []
    for a, b in COMPARISONS:
        for row in [row for row in comparisons if row["a"] == a and row["b"] == b and row["metric"] == "pass@1"]:
            p = (
                ""
                if row["mcnemar_p"] is None
                else " (p < 0.001)"
                if row["mcnemar_p"] < 0.001
                else f" (p = {row['mcnemar_p']:.3f})"
            )
            lines.append(
                f"- **{_STAGE_NAMES[b]}** against **{_STAGE_NAMES[a]}**, {row['label']}: "
                f"{row['mean_b']:.1%} against {row['mean_a']:.1%}, {100 * row['difference']:+.1f} points "
                f"[{100 * row['ci_low']:+.1f}, {100 * row['ci_high']:+.1f}], {_VERDICT_WORDS[row['verdict']]}{p}"
            )
    if not lines:
        return []
    return (
        [
            "## Verdict",
            "",
            "Greedy pass@1 of B against A on the same problems: B − A with its 95% paired-bootstrap interval "
            'and the exact McNemar p; "within noise" when the interval contains 0.',
            "",
        ]
        + lines
        + [""]
    )


def _with_ci(metrics: dict[str, Any], key: str) -> str:
    if key != "pass@1" and metrics.get("k", 1) == 1:
        return ""
    if key not in metrics:  # maj@k of an env without final answers (Env.final_answers)
        return "n/a" if key.startswith("maj@") else ""
    interval = (metrics.get("ci95") or {}).get(key)
    return f"{metrics[key]:.1%}" + (f" [{interval[0]:.1%}, {interval[1]:.1%}]" if interval else "")


def _comparison_lines(comparisons: list[dict[str, Any]]) -> list[str]:
    from agentic_rl.evaluation.compare import format_rows  # local: torch-free

    if not comparisons:
        return []
    lines = [
        "",
        "## Paired comparisons",
        "",
        "Each row compares two stages on the same problems: B − A, the mean per-problem difference with its 95% "
        "paired-bootstrap interval, the problems each side solved and the other did not, and the exact McNemar p-value "
        '(binary outcomes). A difference whose interval contains 0 is within the noise. A "tool calls, both solved" row '
        "counts calls per episode on the problems both stages solved (in plan: the length of the plan), not an accuracy.",
        "",
    ]
    for a, b in COMPARISONS:
        rows = [row for row in comparisons if row["a"] == a and row["b"] == b]
        if rows:
            lines += [f"**{_STAGE_NAMES[b]}** (B) against **{_STAGE_NAMES[a]}** (A):", ""] + format_rows(rows) + [""]
    return lines


def _stage_table(results: dict[str, Any]) -> list[str]:
    lines = ["", "## Stages", "", "| stage | seconds | notes |", "|---|---|---|"]
    for stage, result in results.items():
        notes = ", ".join(
            f"{k} {_fmt(v)}" for k, v in result.items() if k not in ("evals", "seconds", "final", "model", "inputs")
        )
        lines.append(f"| {stage} | {_fmt(result.get('seconds'))} | {notes} |")
    return lines


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return "" if value is None else str(value)


def _plot_rewards(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib.pyplot as plt  # local: torch-free

    fig, ax = plt.subplots(figsize=(6, 3.5))
    keys = sorted({k for row in rows for k in row if k.startswith("reward/") and k.endswith("/mean")})
    for key in keys:
        ax.plot(
            [r["step"] for r in rows if key in r],
            [r[key] for r in rows if key in r],
            label=key[len("reward/") : -len("/mean")],
        )
    ax.set_xlabel("RL step")
    ax.set_ylabel("mean reward")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _rl_plots(metrics_file: Path, plots: Path) -> list[str]:
    """Draw the RL stage's plots from its metrics.jsonl; returns their report lines, each
    plotted metric defined below them (only those the run logged)."""
    rows = read_metrics(metrics_file)
    _plot_rewards(rows, plots / "reward_components.png")
    _plot_length_variance(rows, plots / "length_and_variance.png")
    lines = [
        "",
        "![reward components](plots/reward_components.png)",
        "![policy tokens and groups with reward variance](plots/length_and_variance.png)",
    ]
    if _kl_measured(rows):
        _plot_kl(rows, plots / "kl.png")
        lines.append("![KL to the reference](plots/kl.png)")
    else:
        (plots / "kl.png").unlink(missing_ok=True)  # an earlier report's chart would describe another run
    if _mismatch_measured(rows):
        _plot_kl(rows, plots / "mismatch.png", "rollout/mismatch_kl", "sampler/trainer mismatch KL (k3)")
        lines.append("![sampler/trainer mismatch](plots/mismatch.png)")
    else:
        (plots / "mismatch.png").unlink(missing_ok=True)
    lines.append("")
    shown = {"loss/kl": _kl_measured, "rollout/mismatch_kl": _mismatch_measured}
    logged = [key for key in PLOTTED_METRICS if "{" in key or shown.get(key, lambda rows: _measured(rows, key))(rows)]
    return lines + [f"- `{key}`: {describe_metric(key)}" for key in logged]


def _measured(rows: list[dict[str, Any]], key: str) -> bool:
    """Some step logged a finite value of `key` (a non-finite one is logged as null, read as NaN)."""
    return any(_finite(row.get(key)) for row in rows)


def _kl_measured(rows: list[dict[str, Any]]) -> bool:
    """Some step logged a finite, non-zero KL: with β = 0 there is no reference pass and no
    loss/kl, and a chart of nulls or zeros would only draw an empty line."""
    return any(_finite(row.get("loss/kl")) and row["loss/kl"] != 0.0 for row in rows)


def _mismatch_measured(rows: list[dict[str, Any]]) -> bool:
    """Some step logged a sampler/trainer mismatch above rounding (MISMATCH_SHOWN_ABOVE)."""
    return any(
        _finite(row.get("rollout/mismatch_kl")) and row["rollout/mismatch_kl"] > MISMATCH_SHOWN_ABOVE for row in rows
    )


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _plot_kl(rows: list[dict[str, Any]], path: Path, key: str = "loss/kl", title: str = "KL (k3) to reference") -> None:
    """A k3 KL estimate per trained token, per RL step: KL(π_θ ‖ π_ref) (loss/kl), or the
    sampler/trainer mismatch KL(π_sampler ‖ π_old) (rollout/mismatch_kl)."""
    import matplotlib.pyplot as plt  # local: torch-free

    fig, ax = plt.subplots(figsize=(4, 3.2))
    ax.plot([r["step"] for r in rows], [r.get(key, float("nan")) for r in rows])
    ax.set_title(title)
    ax.set_xlabel("RL step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_length_variance(rows: list[dict[str, Any]], path: Path) -> None:
    """Policy tokens per episode, and the share of groups with reward variance, per RL step."""
    import matplotlib.pyplot as plt  # local: torch-free

    fig, (left, right) = plt.subplots(1, 2, figsize=(7.5, 3.2))
    steps = [r["step"] for r in rows]
    left.plot(steps, [r.get("rollout/completion_tokens/mean", float("nan")) for r in rows])
    left.set_title("policy tokens per episode")
    right.plot(steps, [r.get("rollout/groups_with_variance", float("nan")) for r in rows], label="as sampled")
    if _measured(rows, "train/groups_with_variance"):
        right.plot(steps, [r.get("train/groups_with_variance", float("nan")) for r in rows], label="trained")
    right.set_title("groups with reward variance")
    right.set_ylim(0, 1.05)
    right.legend(fontsize=8)
    for ax in (left, right):
        ax.set_xlabel("RL step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_accuracy(results: dict[str, Any], path: Path) -> bool:
    import matplotlib.pyplot as plt  # local: torch-free

    series: dict[str, list[tuple[str, float]]] = {}
    for stage, name in _STAGE_NAMES.items():
        for label, metrics in (results.get(stage, {}).get("evals") or {}).items():
            series.setdefault(label, []).append((name, metrics["pass@1"], (metrics.get("ci95") or {}).get("pass@1")))
    if not series:
        return False
    fig, ax = plt.subplots(figsize=(6, 3.5))
    width = 0.8 / len(series)
    stage_names = [
        name
        for name in _STAGE_NAMES.values()
        if any(point[0] == name for points in series.values() for point in points)
    ]
    for i, (label, points) in enumerate(series.items()):
        xs = [stage_names.index(name) + i * width for name, _, _ in points]
        values = [value for _, value, _ in points]
        errors = [
            [value - ci[0] if ci else 0.0 for _, value, ci in points],
            [ci[1] - value if ci else 0.0 for _, value, ci in points],
        ]
        ax.bar(xs, values, width=width, label=label, yerr=errors, capsize=3)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(stage_names))], stage_names)
    ax.set_ylabel("pass@1 (greedy), 95% CI")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


_TIMED_STAGES = (("grpo", "GRPO"), ("ppo", "PPO"), ("control", "SFT control"))
"""The stages that continue from SFT's model, each drawn as a line from SFT's point."""


def minutes_series(results: dict[str, Any]) -> dict[str, dict[str, list[tuple[float, float, Any]]]]:
    """{label: {line: [(training minutes, pass@1, 95% interval or None), ...]}}: for each evaluation,
    SFT's point at its training minutes (after base at 0 when base was evaluated), and one line per
    stage that continued from SFT (GRPO or PPO, the control) from SFT's point to its own, at SFT's
    minutes plus its own. Minutes are the stages' `train_seconds` (optimizer steps with their
    rollouts, no model loading): the budget the control is matched on. Empty without a timed SFT."""
    sft = results.get("sft") or {}
    if not sft.get("train_seconds"):
        return {}
    sft_minutes = sft["train_seconds"] / 60
    out: dict[str, dict[str, list[tuple[float, float, Any]]]] = {}
    for label, sft_metrics in ((results.get("eval_sft") or {}).get("evals") or {}).items():
        start = [(sft_minutes, sft_metrics["pass@1"], (sft_metrics.get("ci95") or {}).get("pass@1"))]
        base = ((results.get("eval_base") or {}).get("evals") or {}).get(label)
        if base is not None:
            start.insert(0, (0.0, base["pass@1"], (base.get("ci95") or {}).get("pass@1")))
        lines = {"SFT": start}
        for stage, name in _TIMED_STAGES:
            metrics = ((results.get(f"eval_{stage}") or {}).get("evals") or {}).get(label)
            seconds = (results.get(stage) or {}).get("train_seconds")
            if metrics is not None and seconds:
                lines[name] = [
                    start[-1],
                    (sft_minutes + seconds / 60, metrics["pass@1"], (metrics.get("ci95") or {}).get("pass@1")),
                ]
        out[label] = lines
    return out


def plot_minutes(series: dict[str, dict[str, list[tuple[float, float, Any]]]], path: Path, title: str = "") -> bool:
    """Draw `minutes_series`' shape (one panel per evaluation, 95% intervals as error bars) to
    `path`; False, and nothing drawn, when no line continues from SFT."""
    import matplotlib.pyplot as plt  # local: torch-free

    labels = [label for label, lines in series.items() if len(lines) > 1]
    if not labels:
        return False
    fig, axes = plt.subplots(1, len(labels), figsize=(4.2 * len(labels), 3.4), squeeze=False)
    for ax, label in zip(axes[0], labels):
        for name, points in series[label].items():
            xs, ys = [x for x, _, _ in points], [y for _, y, _ in points]
            errors = [
                [y - ci[0] if ci else 0.0 for _, y, ci in points],
                [ci[1] - y if ci else 0.0 for _, y, ci in points],
            ]
            ax.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, label=name)
        ax.set_title(label)
        ax.set_xlabel("training minutes")
        ax.set_ylim(0, 1.02)
    axes[0][0].set_ylabel("pass@1 (greedy), 95% CI")
    axes[0][0].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def failure_headline(failure: dict[str, Any]) -> str:
    """`task (finish_reason): answered X, expected Y`, or the error of an episode that broke."""
    outcome = (
        f"error: {failure['error']}"
        if failure.get("error")
        else f"answered {failure['final_answer']!r}, expected {failure['reference']!r}"
    )
    return f"{failure['task_id']} ({failure['finish_reason']}): {outcome}"


def _failures(results: dict[str, Any]) -> list[str]:
    for stage in ("eval_grpo", "eval_ppo", "eval_control", "eval_sft", "eval_base"):
        evals = results.get(stage, {}).get("evals")
        if evals:
            lines = []
            for label, metrics in evals.items():
                for failure in metrics.get("failures", [])[:1]:
                    lines.append(f"**{label}**, task {failure_headline(failure)}:")
                    lines.append("```")
                    lines += [
                        f"[{m['role']}] {m.get('content', '')}" for m in failure["messages"] if m["role"] != "system"
                    ]
                    lines.append("```")
            return lines
    return []
