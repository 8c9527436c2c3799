"""Confidence intervals and paired comparisons against hand-computed values and float64
references; `agentic-rl compare` on eval files."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from agentic_rl.evaluation.compare import compare_evaluations, compare_paths
from agentic_rl.evaluation.runner import confidence_intervals, per_problem_scores
from agentic_rl.evaluation.stats import accuracy_interval, mcnemar_exact, paired_difference, wilson_interval


def test_wilson_interval_hand_values():
    """Guards against a Wilson interval that collapses to [0, 0] at 0 successes like the normal approximation;
    hand-computed values, and c > n refused."""
    # 23/100: centre (0.23 + z²/200) / (1 + z²/100), half-width z·sqrt(p(1-p)/n + z²/4n²) / (1 + z²/100)
    low, high = wilson_interval(23, 100)
    assert low == pytest.approx(0.158433, abs=1e-6) and high == pytest.approx(0.321544, abs=1e-6)
    assert wilson_interval(0, 6) == (0.0, pytest.approx(0.390334, abs=1e-6))  # not [0, 0] as the normal approximation
    assert wilson_interval(100, 100) == (pytest.approx(0.963007, abs=1e-6), 1.0)
    with pytest.raises(ValueError, match="0 <= successes <= n"):
        wilson_interval(5, 4)


def test_mcnemar_exact_hand_values():
    """Guards against a McNemar p-value that is not the exact two-sided binomial one (five discordant wins are
    still p = 0.0625)."""
    assert mcnemar_exact(5, 0) == pytest.approx(2 / 2**5)  # 0.0625: five discordant problems are not enough
    assert mcnemar_exact(8, 2) == pytest.approx(2 * (1 + 10 + 45) / 2**10)
    assert mcnemar_exact(3, 3) == 1.0 and mcnemar_exact(0, 0) == 1.0


def test_paired_difference_counts_and_mean():
    """Guards against a paired comparison that miscounts wins and losses, calls 3 against 1 on 8 problems a
    change, or resamples differently each call."""
    a = [1, 0, 0, 1, 0, 1, 0, 0]
    b = [1, 1, 0, 1, 1, 0, 1, 0]
    result = paired_difference(a, b)
    assert result.n == 8 and result.b_better == 3 and result.a_better == 1
    assert result.difference == pytest.approx(2 / 8)
    assert result.mcnemar_p == pytest.approx(mcnemar_exact(3, 1))
    assert result.ci_low <= result.difference <= result.ci_high
    assert result.verdict() == "within noise"  # 3 against 1 on 8 problems
    assert paired_difference(a, b) == result  # a fixed bootstrap seed: the same interval every time


def test_paired_bootstrap_interval_matches_the_normal_theory_on_many_problems():
    """On 400 problems the percentile bootstrap of a mean difference is close to mean ± 1.96·sd/√n
    (float64 reference)."""
    rng = np.random.default_rng(7)
    a = (rng.random(400) < 0.3).astype(float)
    b = np.where(rng.random(400) < 0.2, 1.0 - a, a)  # b flips 20% of a's outcomes
    b[:40] = 1.0
    result = paired_difference(a.tolist(), b.tolist())
    d = b - a
    half = 1.959963984540054 * d.std(ddof=1) / math.sqrt(d.size)
    assert result.ci_low == pytest.approx(d.mean() - half, abs=0.01)
    assert result.ci_high == pytest.approx(d.mean() + half, abs=0.01)


def test_a_clear_improvement_is_significant_and_a_clear_loss_is_too():
    """Guards against a verdict that cannot see a clear effect, or sees it only in one direction: 30 problems
    gained and none lost is significant both ways."""
    a = [0] * 60 + [1] * 40
    b = [1] * 30 + [0] * 30 + [1] * 40  # 30 problems gained, none lost
    assert paired_difference(a, b).verdict() == "B better"
    assert paired_difference(b, a).verdict() == "A better"
    assert paired_difference(a, b).mcnemar_p < 1e-8


def test_paired_difference_rejects_unpaired_inputs():
    """Guards against comparing lists of different problems or with NaN scores, which would give a confident but
    meaningless difference."""
    with pytest.raises(ValueError, match="same problems"):
        paired_difference([1, 0], [1, 0, 1])
    with pytest.raises(ValueError, match="finite"):
        paired_difference([1, float("nan")], [1, 0])


def test_accuracy_interval_uses_wilson_for_binary_and_the_bootstrap_for_fractions():
    """Guards against a Wilson interval on fractional scores (sampled accuracy) where it does not apply:
    fractions get the bootstrap."""
    assert accuracy_interval([1, 0, 0, 0]) == wilson_interval(1, 4)
    low, high = accuracy_interval([0.25, 0.5, 0.75, 0.5])
    assert 0.25 <= low < 0.5 < high <= 0.75


def _result(ids, greedy, correct_of_k=None, k=1, maj=None):
    per_task = {"id": ids, "greedy": greedy}
    if correct_of_k is not None:
        per_task.update(correct_of_k=correct_of_k, maj=maj or [float(c > k // 2) for c in correct_of_k])
    return {"per_task": per_task, "k": k, "n": len(ids)}


def test_per_problem_scores_of_each_metric():
    """Guards against per-problem scores that do not match their metric (pass@k, sampled accuracy, maj@k), or a
    k that was not sampled being accepted."""
    result = _result(["a", "b", "c"], [1, 0, 0], correct_of_k=[4, 1, 0], k=4, maj=[1.0, 0.5, 0.0])
    assert per_problem_scores(result, "pass@1") == [1.0, 0.0, 0.0]
    assert per_problem_scores(result, "sampled_accuracy@T") == [1.0, 0.25, 0.0]
    assert per_problem_scores(result, "pass@4") == [1.0, 1.0, 0.0]
    assert per_problem_scores(result, "maj@4") == [1.0, 0.5, 0.0]
    with pytest.raises(ValueError, match="pass@8"):
        per_problem_scores(result, "pass@8")
    ci = confidence_intervals(result["per_task"], 4)
    assert ci["pass@1"] == list(wilson_interval(1, 3)) and set(ci) == {
        "pass@1",
        "sampled_accuracy@T",
        "pass@4",
        "maj@4",
    }


def test_compare_pairs_problems_by_task_id_not_by_position():
    """Guards against pairing two evaluations by list position: problems are matched by task id, so another
    order gives the same difference."""
    a = _result(["t1", "t2", "t3", "t4"], [1, 1, 0, 0])
    b = _result(["t4", "t3", "t2", "t1"], [0, 1, 1, 1])  # same problems, another order: only t3 gained
    (row,) = compare_evaluations(a, b, "x")
    assert (row["b_better"], row["a_better"], row["difference"]) == (1, 0, pytest.approx(0.25))  # by position: 2 / 1


def test_compare_refuses_different_problem_sets_and_names_them():
    """Guards against comparing evaluations of different problems (not a paired difference) without naming the
    ids found on one side only."""
    with pytest.raises(ValueError, match=r"different problems.*only in A: \['t2'\].*only in B: \['t9'\]"):
        compare_evaluations(_result(["t1", "t2"], [1, 0]), _result(["t1", "t9"], [1, 0]), "x")


def test_compare_command_on_eval_files_and_stage_folders(tmp_path):
    """Guards against `agentic-rl compare` reading only one kind of input or exiting 0 on a missing file: eval
    JSON and stage folders give the same table."""
    sft = _result([f"t{i}" for i in range(100)], [1] * 20 + [0] * 80)
    grpo = _result([f"t{i}" for i in range(100)], [1] * 45 + [0] * 55)
    (tmp_path / "sft.json").write_text(json.dumps({"label": "new", **sft}))
    stage = tmp_path / "eval_grpo"
    stage.mkdir()
    (stage / "DONE.json").write_text(json.dumps({"model": "m", "evals": {"new": grpo}}))
    rows = compare_paths([tmp_path / "sft.json"], [stage])
    assert [(r["label"], r["metric"], r["verdict"]) for r in rows] == [("new", "pass@1", "B better")]
    done = subprocess.run(
        [sys.executable, "-m", "agentic_rl.cli", "compare", str(tmp_path / "sft.json"), str(stage)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "| new | pass@1 | 100 | 20.0% | 45.0% | +25.0%" in done.stdout
    assert json.loads(done.stdout.strip().splitlines()[-1])[0]["b_better"] == 25
    missing = subprocess.run(
        [sys.executable, "-m", "agentic_rl.cli", "compare", str(tmp_path / "nope.json"), str(stage)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert missing.returncode == 2 and "nope.json: no such file" in missing.stderr


def test_compare_several_b_adds_their_per_problem_mean(tmp_path):
    """Three 'seeds' against one A: each row, plus the mean row whose B is the per-problem mean."""
    import json

    from agentic_rl.evaluation.compare import compare_paths

    ids = [f"t{i}" for i in range(6)]

    def write(name, greedy):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"label": "new", "k": 1, "per_task": {"id": ids, "greedy": greedy}}))
        return path

    a = write("sft", [0, 0, 0, 1, 1, 0])
    seeds = [write("s0", [1, 1, 0, 1, 1, 0]), write("s1", [1, 0, 0, 1, 0, 0]), write("s2", [1, 1, 1, 1, 1, 0])]
    rows = compare_paths([a], seeds)
    assert [row["b"] for row in rows] == [str(p) for p in seeds] + ["mean of 3", "mean of 3"]
    mean = rows[-2]
    assert mean["metric"] == "pass@1"
    assert mean["mean_b"] == pytest.approx((1 + 2 / 3 + 1 / 3 + 1 + 2 / 3 + 0) / 6)
    assert mean["difference"] == pytest.approx(mean["mean_b"] - 2 / 6) and mean["mcnemar_p"] is None


def test_compare_several_a_against_several_b_pairs_their_per_problem_means(tmp_path):
    """Three runs against three (e.g. PPO seeds against GRPO seeds): A is the per-problem mean of
    the A inputs, as B's mean is of the B inputs; hand-computed means, no McNemar (not binary)."""
    import json
    import subprocess
    import sys

    ids = [f"t{i}" for i in range(4)]

    def write(name, greedy, order=ids):
        path = tmp_path / f"{name}.json"
        by_id = dict(zip(ids, greedy))
        path.write_text(
            json.dumps({"label": "new", "k": 1, "per_task": {"id": list(order), "greedy": [by_id[i] for i in order]}})
        )
        return path

    a = [write("g0", [1, 0, 0, 1]), write("g1", [1, 1, 0, 0], order=ids[::-1]), write("g2", [0, 0, 0, 1])]
    b = [write("p0", [1, 1, 1, 1]), write("p1", [0, 1, 1, 1])]
    rows = compare_paths(a, b)
    assert [(row["a"], row["b"], row["metric"]) for row in rows] == [
        ("mean of 3", str(b[0]), "pass@1"),
        ("mean of 3", str(b[1]), "pass@1"),
        ("mean of 3", "mean of 2", "pass@1"),
        ("mean of 3", "mean of 2", "pass@1, runs as units"),
    ]
    # A's per-problem means: t0 2/3, t1 1/3, t2 0, t3 2/3 -> 5/12; B's mean: 1/2, 1, 1, 1 -> 7/8.
    mean = rows[-2]
    assert mean["mean_a"] == pytest.approx(5 / 12) and mean["mean_b"] == pytest.approx(7 / 8)
    assert mean["difference"] == pytest.approx(7 / 8 - 5 / 12) and mean["mcnemar_p"] is None
    assert mean["b_better"] == 3 and mean["a_better"] == 1  # t0: 1/2 against 2/3
    assert rows[0]["difference"] == pytest.approx(1 - 5 / 12)

    cli = [sys.executable, "-m", "agentic_rl.cli", "compare"]
    done = subprocess.run(
        cli + ["--json", "--a", *map(str, a), "--b", *map(str, b)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])[-2]["difference"] == pytest.approx(7 / 8 - 5 / 12)
    mixed = subprocess.run(
        cli + [str(a[0]), "--a", str(a[1]), "--b", str(b[0])], capture_output=True, text=True, timeout=120
    )
    assert mixed.returncode == 2 and "not a mix" in mixed.stderr
    lonely = subprocess.run(cli + [str(a[0])], capture_output=True, text=True, timeout=120)
    assert lonely.returncode == 2 and "needs A and at least one B" in lonely.stderr
    different = tmp_path / "odd.json"
    different.write_text(
        json.dumps({"label": "new", "k": 1, "per_task": {"id": ["t0", "t1", "t2", "x"], "greedy": [1, 1, 1, 1]}})
    )
    with pytest.raises(ValueError, match="the A inputs hold different problems"):
        compare_paths([a[0], different], b)


def test_compare_pairs_tool_calls_on_the_problems_both_sides_solved(tmp_path):
    """Guards against a plan-length comparison that counts unsolved episodes (a failure's calls are
    not a plan's length), mispairs problems listed in another order, or calls more calls "better":
    B − A in tool calls over the problems both solved, hand-computed, for one seed and for the
    mean of two (a problem counts when every seed solved it)."""
    import json

    from agentic_rl.evaluation.compare import TOOL_CALLS_SOLVED, compare_paths, format_rows

    ids = [f"t{i}" for i in range(5)]

    def write(name, greedy, calls, order=ids):
        path = tmp_path / f"{name}.json"
        by_id = dict(zip(ids, zip(greedy, calls)))
        path.write_text(
            json.dumps(
                {
                    "label": "plan",
                    "k": 1,
                    "per_task": {
                        "id": list(order),
                        "greedy": [by_id[i][0] for i in order],
                        "tool_calls": [by_id[i][1] for i in order],
                    },
                }
            )
        )
        return path

    sft = write("sft", [1, 1, 1, 0, 1], [9, 7, 12, 24, 6])
    s0 = write("s0", [1, 1, 0, 1, 1], [5, 7, 3, 10, 4], order=ids[::-1])
    s1 = write("s1", [1, 0, 1, 1, 1], [6, 30, 8, 11, 5])
    rows = [row for row in compare_paths([sft], [s0, s1]) if row["metric"] == TOOL_CALLS_SOLVED]
    # s0 against SFT, solved by both: t0 (9 -> 5), t1 (7 -> 7), t4 (6 -> 4): -4, 0, -2.
    assert (
        rows[0]["n"] == 3 and rows[0]["mean_a"] == pytest.approx(22 / 3) and rows[0]["mean_b"] == pytest.approx(16 / 3)
    )
    assert rows[0]["difference"] == pytest.approx(-2.0) and (rows[0]["b_better"], rows[0]["a_better"]) == (0, 2)
    # the mean of s0 and s1: both seeds solved t0 (5.5 calls), t3 and t4 (4.5); SFT solved t0 and t4.
    mean = rows[-1]
    assert (
        mean["b"] == "mean of 2" and mean["n"] == 2 and mean["difference"] == pytest.approx(((5.5 - 9) + (4.5 - 6)) / 2)
    )
    assert mean["verdict"] == "B fewer" and mean["mcnemar_p"] is None  # both differences negative: every resample is
    table = "\n".join(format_rows(rows))
    assert "| 7.33 | 5.33 | -2.00 [" in table and "%" not in table.split("\n")[2]
    # a side without per-problem tool calls (an older evaluation) gives no such row, and no error
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"label": "plan", "k": 1, "per_task": {"id": ids, "greedy": [1, 1, 1, 1, 1]}}))
    assert [row["metric"] for row in compare_paths([old], [s0])] == ["pass@1"]


def test_student_t_quantile_matches_the_tables_and_the_incomplete_beta():
    """Guards against a run-level interval built on a wrong t quantile (the normal's 1.96 at three seeds
    would make it 2.2x too narrow): the textbook 97.5% values at whole degrees of freedom, and at
    fractional ones (Welch) the quantile whose CDF, computed independently from mpmath's regularized
    incomplete beta, is 0.975."""
    import mpmath

    from agentic_rl.evaluation.stats import student_t_quantile

    for df, table in [(1, 12.7062), (2, 4.3027), (4, 2.7764), (10, 2.2281), (30, 2.0423), (1e6, 1.9600)]:
        assert student_t_quantile(0.975, df) == pytest.approx(table, abs=1e-4)
    for df in (1.6842, 3.5, 7.25):
        x = student_t_quantile(0.975, df)
        cdf = 1 - 0.5 * mpmath.betainc(df / 2, 0.5, 0, df / (df + x * x), regularized=True)
        assert float(cdf) == pytest.approx(0.975, abs=1e-6)
    assert student_t_quantile(0.95, 2) == pytest.approx(2.9200, abs=1e-4)
    with pytest.raises(ValueError, match="0.5 < probability < 1"):
        student_t_quantile(0.4, 3)


def test_run_level_difference_treats_each_run_as_one_sample():
    """Guards against calling a lead "over 3 seeds" on an interval that resamples problems: with one A
    run, the t-interval of the per-seed differences (t(2) = 4.3027); with several, Welch's interval
    with its Welch-Satterthwaite degrees of freedom; both hand-computed."""
    from agentic_rl.evaluation.stats import run_level_difference

    one = run_level_difference([0.5], [0.6, 0.5, 0.7])  # differences 0.1, 0, 0.2: mean 0.1, sd 0.1
    half = 4.3027 * 0.1 / 3**0.5
    assert one.difference == pytest.approx(0.1) and one.n == 3 and one.mcnemar_p is None
    assert (one.ci_low, one.ci_high) == pytest.approx((0.1 - half, 0.1 + half), abs=1e-4)
    assert (one.b_better, one.a_better, one.verdict()) == (2, 0, "within noise")
    # Welch: variances 0.01 each over 3 runs: se sqrt(0.02 / 3), df = 4 exactly, t(4) = 2.7764
    two = run_level_difference([0.4, 0.5, 0.6], [0.6, 0.7, 0.8])
    half = 2.7764 * (0.02 / 3) ** 0.5
    assert (two.ci_low, two.ci_high) == pytest.approx((0.2 - half, 0.2 + half), abs=1e-4)
    # unequal spreads: shares 0.01 and 0.01 / 3, df = (0.04 / 3)^2 / (0.01^2 / 1 + (0.01 / 3)^2 / 2) = 1.6842
    uneven = run_level_difference([0.3, 0.5], [0.6, 0.7, 0.8])
    from agentic_rl.evaluation.stats import student_t_quantile

    half = student_t_quantile(0.975, (0.04 / 3) ** 2 / (0.01**2 + (0.01 / 3) ** 2 / 2)) * (0.04 / 3) ** 0.5
    assert half > 0.5 and (uneven.ci_low, uneven.ci_high) == pytest.approx((0.3 - half, 0.3 + half))
    tight = run_level_difference([0.5], [0.7, 0.71, 0.69])
    assert tight.verdict() == "B better" and tight.ci_low > 0.15
    with pytest.raises(ValueError, match="at least two B runs"):
        run_level_difference([0.5], [0.6])


def test_compare_several_seeds_adds_a_row_with_runs_as_units(tmp_path):
    """Guards against `compare` giving only intervals that resample problems when the claim is about
    seeds: three seeds against one SFT evaluation add the row "pass@1, runs as units", the t-interval
    of the three accuracy differences, hand-computed, whose column counts runs above / below A."""
    import json

    from agentic_rl.evaluation.compare import RUNS_AS_UNITS, compare_paths, format_rows

    ids = [f"t{i}" for i in range(6)]

    def write(name, greedy):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"label": "new", "k": 1, "per_task": {"id": ids, "greedy": greedy}}))
        return path

    sft = write("sft", [0, 0, 0, 1, 1, 0])  # 2/6
    seeds = [write("s0", [1, 1, 0, 1, 1, 0]), write("s1", [1, 0, 0, 1, 0, 0]), write("s2", [1, 1, 1, 1, 1, 0])]
    row = [row for row in compare_paths([sft], seeds) if row["metric"] == RUNS_AS_UNITS]
    assert len(row) == 1 and row[0]["b"] == "mean of 3"
    # per-seed differences 2/6, 0, 3/6: mean 5/18, sd sqrt(42 / 648)
    half = 4.3027 * (42 / 648) ** 0.5 / 3**0.5
    assert row[0]["difference"] == pytest.approx(5 / 18) and row[0]["n"] == 3
    assert (row[0]["ci_low"], row[0]["ci_high"]) == pytest.approx((5 / 18 - half, 5 / 18 + half), abs=1e-4)
    assert (row[0]["b_better"], row[0]["a_better"], row[0]["verdict"]) == (2, 0, "within noise")
    assert f"| {RUNS_AS_UNITS} | 3 | 33.3% | 61.1% | +27.8% [" in "\n".join(format_rows(row))
    assert not [row for row in compare_paths([sft], seeds[:1]) if row["metric"] == RUNS_AS_UNITS]
