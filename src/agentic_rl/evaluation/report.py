"""The pipeline report: report.md with a metrics table per stage, plus PNG plots.

    plots/reward_components.png   GRPO reward per step, one line per component
    plots/accuracy_by_stage.png   pass@1 of each evaluation at base / SFT / GRPO
    plots/kl_and_length.png       GRPO KL and mean completion length per step
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentic_rl.strict_json import write_json

_STAGE_NAMES = {"eval_base": "base", "eval_sft": "after SFT", "eval_grpo": "after GRPO"}
_COLUMNS = ("pass@1", "format_error_rate", "mean_tokens", "tool_calls_per_episode", "tool_success_rate")


def write_report(root: Path, results: dict[str, Any], cfg: Any) -> Path:
    """Write report.md, results.json and plots/ under `root`; returns the report path."""
    import matplotlib

    matplotlib.use("Agg")
    plots = root / "plots"
    plots.mkdir(exist_ok=True)
    lines = [f"# agentic-rl pipeline report", "", f"Base model: `{cfg.model}`. Run directory: `{root}`.", ""]
    lines += _eval_table(results)
    lines += _stage_table(results)
    grpo_metrics = root / "grpo" / "metrics.jsonl"
    if grpo_metrics.exists():
        from agentic_rl.training.run_dir import read_metrics

        rows = read_metrics(grpo_metrics)
        _plot_rewards(rows, plots / "reward_components.png")
        _plot_kl_length(rows, plots / "kl_and_length.png")
        lines += ["", "![reward components](plots/reward_components.png)", "![KL and length](plots/kl_and_length.png)"]
    if _plot_accuracy(results, plots / "accuracy_by_stage.png"):
        lines += ["![accuracy by stage](plots/accuracy_by_stage.png)"]
    failures = _failures(results)
    if failures:
        lines += ["", "## Sample failures after the last evaluated stage", ""] + failures
    write_json(root / "results.json", results)
    report = root / "report.md"
    report.write_text("\n".join(lines) + "\n")
    return report


def _eval_table(results: dict[str, Any]) -> list[str]:
    lines = ["## Evaluation", "", "| evaluation | stage | " + " | ".join(_COLUMNS) + " | extra |", "|---|---|" + "---|" * (len(_COLUMNS) + 1)]
    for stage, name in _STAGE_NAMES.items():
        for label, metrics in (results.get(stage, {}).get("evals") or {}).items():
            cells = [_fmt(metrics.get(column)) for column in _COLUMNS]
            extra = ", ".join(
                f"{k} {_fmt(v)}" for k, v in metrics.items()
                if k.startswith(("accuracy/", "pass@", "maj@", "solution_steps")) and k != "pass@1"
            )
            lines.append(f"| {label} | {name} | " + " | ".join(cells) + f" | {extra} |")
    return lines


def _stage_table(results: dict[str, Any]) -> list[str]:
    lines = ["", "## Stages", "", "| stage | seconds | notes |", "|---|---|---|"]
    for stage, result in results.items():
        notes = ", ".join(f"{k} {_fmt(v)}" for k, v in result.items() if k not in ("evals", "seconds", "final", "model", "inputs"))
        lines.append(f"| {stage} | {_fmt(result.get('seconds'))} | {notes} |")
    return lines


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return "" if value is None else str(value)


def _plot_rewards(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    keys = sorted({k for row in rows for k in row if k.startswith("reward/") and k.endswith("/mean")})
    for key in keys:
        ax.plot([r["step"] for r in rows if key in r], [r[key] for r in rows if key in r], label=key[len("reward/"):-len("/mean")])
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("mean reward")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_kl_length(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.2))
    steps = [r["step"] for r in rows]
    left.plot(steps, [r.get("loss/kl", float("nan")) for r in rows])
    left.set_title("KL (k3) to reference")
    right.plot(steps, [r.get("rollout/completion_tokens/mean", float("nan")) for r in rows])
    right.set_title("policy tokens per episode")
    for ax in (left, right):
        ax.set_xlabel("GRPO step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_accuracy(results: dict[str, Any], path: Path) -> bool:
    import matplotlib.pyplot as plt

    series: dict[str, list[tuple[str, float]]] = {}
    for stage, name in _STAGE_NAMES.items():
        for label, metrics in (results.get(stage, {}).get("evals") or {}).items():
            series.setdefault(label, []).append((name, metrics["pass@1"]))
    if not series:
        return False
    fig, ax = plt.subplots(figsize=(6, 3.5))
    width = 0.8 / len(series)
    stage_names = list(_STAGE_NAMES.values())
    for i, (label, points) in enumerate(series.items()):
        xs = [stage_names.index(name) + i * width for name, _ in points]
        ax.bar(xs, [value for _, value in points], width=width, label=label)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(stage_names))], stage_names)
    ax.set_ylabel("pass@1 (greedy)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _failures(results: dict[str, Any]) -> list[str]:
    for stage in ("eval_grpo", "eval_sft", "eval_base"):
        evals = results.get(stage, {}).get("evals")
        if evals:
            lines = []
            for label, metrics in evals.items():
                for failure in metrics.get("failures", [])[:1]:
                    lines.append(f"**{label}**, task `{failure['task_id']}` ({failure['finish_reason']}, answered {failure['final_answer']!r}, expected {failure['reference']!r}):")
                    lines.append("```")
                    lines += [f"[{m['role']}] {m.get('content', '')}" for m in failure["messages"] if m["role"] != "system"]
                    lines.append("```")
            return lines
    return []
