"""The pipeline report opens with its verdict and leaves out what the run did not measure."""

import json

from agentic_rl.evaluation.report import write_report


class _Cfg:
    model = "tiny"


def _evaluation(greedy: list[int]) -> dict:
    n = len(greedy)
    return {"n": n, "k": 1, "pass@1": sum(greedy) / n, "ci95": {"pass@1": [0.0, 1.0]},
            "per_task": {"id": [f"t{i}" for i in range(n)], "greedy": greedy},
            "format_error_rate": 0.0, "truncated_rate": 0.0, "mean_tokens": 10.0, "tool_calls_per_episode": 2.0,
            "tool_success_rate": 1.0}


def _results() -> dict:
    # 40 problems: SFT solves the first 10; GRPO 30 (gains 20, loses none); the control 12.
    sft, grpo, control = [1] * 10 + [0] * 30, [1] * 30 + [0] * 10, [1] * 12 + [0] * 28
    return {"sft": {"seconds": 1.0}, "eval_sft": {"evals": {"new": _evaluation(sft)}},
            "grpo": {"seconds": 2.0}, "eval_grpo": {"evals": {"new": _evaluation(grpo)}},
            "control": {"seconds": 2.0}, "eval_control": {"evals": {"new": _evaluation(control)}}}


def _rl_metrics(root, rows):
    (root / "grpo").mkdir()
    (root / "grpo" / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_the_report_opens_with_one_verdict_line_per_stage_pair(tmp_path):
    """Guards against a report whose answer (did RL beat SFT and the control?) sits below 60 table rows."""
    report = write_report(tmp_path, _results(), _Cfg()).read_text()
    body = report.split("## Verdict", 1)[1].split("## Evaluation", 1)[0]
    assert report.index("## Verdict") < report.index("## Evaluation")
    lines = [line for line in body.splitlines() if line.startswith("- ")]
    # GRPO − SFT = 20/40 = +50 points, all 20 discordant pairs for GRPO: McNemar p = 2 · 0.5^20 < 0.001.
    assert lines[0].startswith("- **after GRPO** against **after SFT**: new +50.0 points [")
    assert lines[0].endswith("better (p < 0.001)")
    # The control gains 2 of 40 (+5 points), both discordant pairs its own: p = 2 · 0.5^2 = 0.5.
    assert lines[1].startswith("- **SFT control** against **after SFT**: new +5.0 points [")
    assert lines[1].endswith("within noise (p = 0.500)")
    assert lines[2].startswith("- **after GRPO** against **SFT control**: new +45.0 points [")
    assert len(lines) == 3


def test_greedy_only_evaluations_print_no_empty_sampled_columns(tmp_path):
    """Guards against the empty sampled-accuracy, pass@k, maj@k and solved columns of a k = 1 run."""
    report = write_report(tmp_path, _results(), _Cfg()).read_text()
    header = next(line for line in report.splitlines() if line.startswith("| evaluation | stage |"))
    assert "sampled accuracy" not in header and "pass@k" not in header and "solved" not in header
    row = next(line for line in report.splitlines() if line.startswith("| new | after GRPO |"))
    assert row.count("|") == header.count("|")
    assert "| 75.0% [0.0%, 100.0%] | 0.000 |" in row  # pass@1 is followed at once by the format-error rate


def test_the_kl_panel_is_drawn_only_when_kl_was_logged(tmp_path):
    """Guards against an empty KL chart (and its definition) in a β = 0 run, which has no reference pass."""
    import matplotlib.image

    rows = [{"step": s, "reward/accuracy/mean": 0.1 * s, "rollout/completion_tokens/mean": 50.0,
             "rollout/groups_with_variance": 0.5} for s in range(1, 4)]
    _rl_metrics(tmp_path, rows)
    without = write_report(tmp_path, _results(), _Cfg()).read_text()
    width_without = matplotlib.image.imread(tmp_path / "plots" / "kl_and_length.png").shape[1]
    assert "`loss/kl`" not in without

    other = tmp_path / "with-kl"
    other.mkdir()
    _rl_metrics(other, [{**row, "loss/kl": 0.01} for row in rows])
    with_kl = write_report(other, _results(), _Cfg()).read_text()
    width_with = matplotlib.image.imread(other / "plots" / "kl_and_length.png").shape[1]
    assert "`loss/kl`" in with_kl
    assert width_with > width_without  # three panels against two
