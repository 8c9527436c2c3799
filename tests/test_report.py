"""The pipeline report opens with its verdict and leaves out what the run did not measure."""

import json

from agentic_rl.evaluation.report import write_report
from agentic_rl.strict_json import loads_strict


class _Cfg:
    model = "tiny"


def _evaluation(greedy: list[int]) -> dict:
    n = len(greedy)
    return {
        "n": n,
        "k": 1,
        "pass@1": sum(greedy) / n,
        "ci95": {"pass@1": [0.0, 1.0]},
        "per_task": {"id": [f"t{i}" for i in range(n)], "greedy": greedy},
        "format_error_rate": 0.0,
        "truncated_rate": 0.0,
        "mean_tokens": 10.0,
        "tool_calls_per_episode": 2.0,
        "tool_success_rate": 1.0,
    }


def _results() -> dict:
    # 40 problems: SFT solves the first 10; GRPO 30 (gains 20, loses none); the control 12.
    sft, grpo, control = [1] * 10 + [0] * 30, [1] * 30 + [0] * 10, [1] * 12 + [0] * 28
    return {
        "sft": {"seconds": 1.0},
        "eval_sft": {"evals": {"new": _evaluation(sft)}},
        "grpo": {"seconds": 2.0},
        "eval_grpo": {"evals": {"new": _evaluation(grpo)}},
        "control": {"seconds": 2.0},
        "eval_control": {"evals": {"new": _evaluation(control)}},
    }


def _rl_metrics(root, rows):
    (root / "grpo").mkdir(exist_ok=True)
    (root / "grpo" / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_the_report_opens_with_one_verdict_line_per_stage_pair(tmp_path):
    """Guards against a report whose answer (did RL beat SFT and the control?) sits below 60 table rows."""
    report = write_report(tmp_path, _results(), _Cfg()).read_text()
    body = report.split("## Verdict", 1)[1].split("## Evaluation", 1)[0]
    assert report.index("## Verdict") < report.index("## Evaluation")
    lines = [line for line in body.splitlines() if line.startswith("- ")]
    # GRPO − SFT = 20/40 = +50 points, all 20 discordant pairs for GRPO: McNemar p = 2 · 0.5^20 < 0.001.
    assert lines[0].startswith("- **after GRPO** against **after SFT**, new: 75.0% against 25.0%, +50.0 points [")
    assert lines[0].endswith("better (p < 0.001)")
    # The control gains 2 of 40 (+5 points), both discordant pairs its own: p = 2 · 0.5^2 = 0.5.
    assert lines[1].startswith("- **SFT control** against **after SFT**, new: 30.0% against 25.0%, +5.0 points [")
    assert lines[1].endswith("within noise (p = 0.500)")
    assert lines[2].startswith("- **after GRPO** against **SFT control**, new: 75.0% against 30.0%, +45.0 points [")
    assert len(lines) == 3


def _four_stages() -> dict:
    """base, SFT, GRPO and the control on two evaluations (problem t<i> solved iff listed 1):
    seen-stories (8): base 0/8, SFT 6/8, GRPO 1/8 (t0 only), control 6/8 (SFT's own six);
    new-stories (10): base 0/10, SFT 3/10, GRPO 8/10, control 4/10 (each a superset of the one before)."""
    seen = {"base": [0] * 8, "sft": [1] * 6 + [0] * 2, "grpo": [1] + [0] * 7, "control": [1] * 6 + [0] * 2}
    new = {"base": [0] * 10, "sft": [1] * 3 + [0] * 7, "grpo": [1] * 8 + [0] * 2, "control": [1] * 4 + [0] * 6}
    return {
        f"eval_{stage}": {"evals": {"seen-stories": _evaluation(seen[stage]), "new-stories": _evaluation(new[stage])}}
        for stage in ("base", "sft", "grpo", "control")
    }


def _interval(results: dict, a: str, b: str, label: str) -> str:
    """The 95% interval of B − A as compare's function gives it (a bootstrap: not by hand)."""
    from agentic_rl.evaluation.compare import compare_evaluations

    row = compare_evaluations(results[a]["evals"][label], results[b]["evals"][label], label)[0]
    return f"[{100 * row['ci_low']:+.1f}, {100 * row['ci_high']:+.1f}]"


def test_the_verdict_has_one_line_per_stage_pair_and_evaluation_with_both_accuracies(tmp_path):
    """Guards against a verdict that names a difference without the two accuracies it is taken
    from, or crams the evaluations of a stage pair into one line. The accuracies, differences,
    McNemar p (2 · 0.5^discordant when every discordant problem favours one side) and verdict
    words are computed by hand; the bootstrap intervals come from compare's function."""
    results = _four_stages()
    report = write_report(tmp_path, results, _Cfg()).read_text()
    body = report.split("## Verdict", 1)[1].split("## Evaluation", 1)[0]
    lines = [line for line in body.splitlines() if line.startswith("- ")]

    def ci(a: str, b: str, label: str) -> str:
        return _interval(results, f"eval_{a}", f"eval_{b}", label)

    assert lines == [
        # six of 8 gained, none lost: a resample without a gain has probability (2/8)^8; p = 2 · 0.5^6
        f"- **after SFT** against **base**, seen-stories: 75.0% against 0.0%, +75.0 points {ci('base', 'sft', 'seen-stories')}, "
        "better (p = 0.031)",
        # three of 10 gained: a resample holds none of them with probability 0.7^10 = 2.8% > 2.5%, so the interval starts at 0
        f"- **after SFT** against **base**, new-stories: 30.0% against 0.0%, +30.0 points {ci('base', 'sft', 'new-stories')}, "
        "within noise (p = 0.250)",
        # five of 8 lost, none gained: worse, though p = 2 · 0.5^5 = 0.0625
        f"- **after GRPO** against **after SFT**, seen-stories: 12.5% against 75.0%, -62.5 points {ci('sft', 'grpo', 'seen-stories')}, "
        "worse (p = 0.062)",
        f"- **after GRPO** against **after SFT**, new-stories: 80.0% against 30.0%, +50.0 points {ci('sft', 'grpo', 'new-stories')}, "
        "better (p = 0.062)",
        # the same six problems: every difference is 0, and so is the whole interval
        "- **SFT control** against **after SFT**, seen-stories: 75.0% against 75.0%, +0.0 points [+0.0, +0.0], within noise (p = 1.000)",
        f"- **SFT control** against **after SFT**, new-stories: 40.0% against 30.0%, +10.0 points {ci('sft', 'control', 'new-stories')}, "
        "within noise (p = 1.000)",
        f"- **after GRPO** against **SFT control**, seen-stories: 12.5% against 75.0%, -62.5 points "
        f"{ci('control', 'grpo', 'seen-stories')}, worse (p = 0.062)",
        # four of 10 gained: a resample without one has probability 0.6^10 = 0.6%; p = 2 · 0.5^4
        f"- **after GRPO** against **SFT control**, new-stories: 80.0% against 40.0%, +40.0 points "
        f"{ci('control', 'grpo', 'new-stories')}, better (p = 0.125)",
    ]
    assert ci("base", "sft", "new-stories").startswith("[+0.0, ")


def test_a_run_without_a_control_compares_each_stage_with_the_one_before_only(tmp_path):
    """Guards against a verdict that invents a control the run did not train, or skips the RL
    stage when it is PPO."""
    stages = _four_stages()
    results = {"eval_sft": stages["eval_sft"], "eval_ppo": stages["eval_grpo"]}  # PPO's scores: GRPO's above
    report = write_report(tmp_path, results, _Cfg()).read_text()
    body = report.split("## Verdict", 1)[1].split("## Evaluation", 1)[0]
    lines = [line for line in body.splitlines() if line.startswith("- ")]
    assert [line.split(":", 1)[0] for line in lines] == [
        "- **after PPO** against **after SFT**, seen-stories",
        "- **after PPO** against **after SFT**, new-stories",
    ]
    assert "control" not in body


def _rl_rows(**extra) -> list[dict]:
    return [
        {
            "step": s,
            "reward/accuracy/mean": 0.1 * s,
            "rollout/completion_tokens/mean": 50.0,
            "rollout/groups_with_variance": 0.5,
            **extra,
        }
        for s in range(1, 4)
    ]


def test_a_beta_zero_run_gets_no_kl_chart(tmp_path):
    """Guards against an empty KL chart (and its definition) in a β = 0 run, which has no
    reference pass and logs no loss/kl; a metrics file whose KL is only nulls or zeros (an
    older writer) draws none either."""
    for rows in (_rl_rows(), _rl_rows(**{"loss/kl": None}), _rl_rows(**{"loss/kl": 0.0})):
        _rl_metrics(tmp_path, rows)
        report = write_report(tmp_path, _results(), _Cfg()).read_text()
        assert not (tmp_path / "plots" / "kl.png").exists()
        assert "kl.png" not in report and "KL" not in report and "`loss/kl`" not in report
        assert (tmp_path / "plots" / "length_and_variance.png").exists()
        assert "![policy tokens and groups with reward variance](plots/length_and_variance.png)" in report
        assert "`rollout/completion_tokens/mean`" in report


def test_logged_kl_values_get_their_chart_and_definition(tmp_path):
    """Guards against a β > 0 run whose KL to the reference is never shown, and against a stale
    KL chart left by an earlier report in the same folder."""
    _rl_metrics(tmp_path, _rl_rows(**{"loss/kl": 0.01}))
    report = write_report(tmp_path, _results(), _Cfg()).read_text()
    assert (tmp_path / "plots" / "kl.png").exists()
    assert "![KL to the reference](plots/kl.png)" in report and "`loss/kl`" in report

    _rl_metrics(tmp_path, _rl_rows())  # the same folder, rewritten by a β = 0 run
    write_report(tmp_path, _results(), _Cfg())
    assert not (tmp_path / "plots" / "kl.png").exists()


def test_a_mismatch_above_rounding_gets_its_chart_and_definition(tmp_path):
    """Guards against a bf16-rollout run whose sampler/trainer mismatch is never shown, and a chart
    of float32 rounding (or of the exact zeros of old_logprobs: sampling) where there is none."""
    for value in (0.0, 1e-13, None):
        _rl_metrics(tmp_path, _rl_rows(**{"rollout/mismatch_kl": value}))
        report = write_report(tmp_path, _results(), _Cfg()).read_text()
        assert not (tmp_path / "plots" / "mismatch.png").exists() and "rollout/mismatch_kl" not in report
    _rl_metrics(tmp_path, _rl_rows(**{"rollout/mismatch_kl": 2e-4}))
    report = write_report(tmp_path, _results(), _Cfg()).read_text()
    assert (tmp_path / "plots" / "mismatch.png").exists()
    assert "![sampler/trainer mismatch](plots/mismatch.png)" in report and "`rollout/mismatch_kl`" in report


def _sampled(greedy: list[int], correct_of_k: list[int], k: int) -> dict:
    n = len(greedy)
    return {
        **_evaluation(greedy),
        "k": k,
        "sampled_accuracy@T": sum(correct_of_k) / (n * k),
        f"pass@{k}": sum(c > 0 for c in correct_of_k) / n,
        f"maj@{k}": 0.5,
        "solved/never": sum(c == 0 for c in correct_of_k),
        "solved/sometimes": sum(0 < c < k for c in correct_of_k),
        "solved/always": sum(c == k for c in correct_of_k),
        "per_task": {
            "id": [f"t{i}" for i in range(n)],
            "greedy": greedy,
            "correct_of_k": correct_of_k,
            "maj": [1, 1, 0, 0],
        },
    }


def test_the_sampled_columns_appear_exactly_when_an_evaluation_sampled(tmp_path):
    """Guards against the empty sampled-accuracy, pass@k, maj@k and solved columns (and summary
    fields) of a k = 1 run, and against losing them in a k > 1 run."""
    greedy = tmp_path / "greedy"
    greedy.mkdir()
    lines = write_report(greedy, _results(), _Cfg()).read_text().splitlines()
    header = next(line for line in lines if line.startswith("| evaluation | stage |"))
    assert "sampled accuracy" not in header and "pass@k" not in header and "solved" not in header
    row = next(line for line in lines if line.startswith("| new | after GRPO |"))
    assert row.count("|") == header.count("|")
    assert "| 75.0% [0.0%, 100.0%] | 0.000 |" in row  # pass@1 is followed at once by the format-error rate
    summary = loads_strict((greedy / "summary.json").read_text())
    assert summary["stages"]["eval_grpo"]["new"] == {"n": 40, "k": 1, "pass@1": {"value": 0.75, "ci95": [0.0, 1.0]}}
    assert {row["metric"] for row in summary["comparisons"]} == {"pass@1"}

    # 4 problems, 4 samples each: SFT correct 0, 2, 4, 4 of 4 (sampled accuracy 10/16, pass@4 3/4).
    results = {
        "eval_sft": {"evals": {"new": _sampled([0, 1, 1, 0], [0, 2, 4, 4], 4)}},
        "eval_grpo": {"evals": {"new": _sampled([1, 1, 1, 0], [1, 3, 4, 4], 4)}},
    }
    lines = write_report(tmp_path, results, _Cfg()).read_text().splitlines()
    header = next(line for line in lines if line.startswith("| evaluation | stage |"))
    assert "sampled accuracy | pass@k | maj@k | never / sometimes / always solved |" in header
    row = next(line for line in lines if line.startswith("| new | after SFT |"))
    assert row.count("|") == header.count("|") and "| 50.0% [0.0%, 100.0%] | 62.5% | 75.0% | 50.0% | 1 / 1 / 2 |" in row
    summary = loads_strict((tmp_path / "summary.json").read_text())
    assert summary["stages"]["eval_sft"]["new"]["solved/sometimes"] == 1
    assert summary["stages"]["eval_sft"]["new"]["pass@4"]["value"] == 0.75
    assert [row["metric"] for row in summary["comparisons"]] == ["pass@1", "sampled_accuracy@T", "pass@4", "maj@4"]


def test_accuracy_against_minutes_starts_each_continuation_at_sfts_end(tmp_path):
    """Guards against a minutes plot that puts GRPO and the control at their own stage times
    (both start from SFT's model, so their x is SFT's minutes plus theirs) or draws a line for a
    stage the run did not train. SFT trained 300 s, GRPO 600 s, the control 590 s."""
    from agentic_rl.evaluation.report import minutes_series

    results = _results()
    results["sft"]["train_seconds"], results["grpo"]["train_seconds"] = 300.0, 600.0
    results["control"]["train_seconds"] = 590.0
    series = minutes_series(results)["new"]
    assert [(x, y) for x, y, _ in series["SFT"]] == [(5.0, 0.25)]
    assert [(x, y) for x, y, _ in series["GRPO"]] == [(5.0, 0.25), (15.0, 0.75)]
    assert [(x, y) for x, y, _ in series["SFT control"]] == [(5.0, 0.25), (5.0 + 590.0 / 60, 0.30)]
    assert series["GRPO"][1][2] == [0.0, 1.0]  # the evaluation's own interval rides along
    report = write_report(tmp_path, results, _Cfg()).read_text()
    assert "![accuracy against training minutes](plots/accuracy_by_minutes.png)" in report
    assert (tmp_path / "plots" / "accuracy_by_minutes.png").stat().st_size > 0

    del results["control"], results["eval_control"]
    assert set(minutes_series(results)["new"]) == {"SFT", "GRPO"}


def test_an_untimed_run_gets_no_minutes_plot(tmp_path):
    """Guards against a plot with made-up minutes when the stages recorded no training time, and
    against a stale plot from an earlier report staying beside the new one."""
    from agentic_rl.evaluation.report import minutes_series

    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "accuracy_by_minutes.png").write_bytes(b"stale")
    report = write_report(tmp_path, _results(), _Cfg()).read_text()
    assert minutes_series(_results()) == {}
    assert "accuracy_by_minutes" not in report
    assert not (tmp_path / "plots" / "accuracy_by_minutes.png").exists()


def test_each_evaluation_says_which_precision_decoded_it(tmp_path):
    """Guards against an evaluation whose decode precision (bf16 or int8 copies, issue 35) is
    known to the run but shown nowhere: the table row and summary.json both carry it."""
    results = _results()
    results["eval_grpo"]["evals"]["new"]["decoded_in"] = "int8"
    lines = write_report(tmp_path, results, _Cfg()).read_text().splitlines()
    assert "decoded in int8 |" in next(line for line in lines if line.startswith("| new | after GRPO |"))
    assert "decoded in" not in next(line for line in lines if line.startswith("| new | after SFT |"))  # not recorded
    summary = loads_strict((tmp_path / "summary.json").read_text())
    assert summary["stages"]["eval_grpo"]["new"]["decoded_in"] == "int8"
