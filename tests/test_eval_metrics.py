"""Evaluation metrics on constructed cases: pass@k against its exact formula, maj@k with ties,
and the per-episode statistics against hand-computed values."""

import dataclasses
import itertools
from fractions import Fraction

import pytest
from hypothesis import given, strategies as st

from agentic_rl.envs.base import Task
from agentic_rl.evaluation.metrics import maj_at_k, pass_at_k
from agentic_rl.evaluation.runner import episode_statistics
from agentic_rl.rollout.trajectory import Span, Trajectory


def brute_force_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """Enumerate every k-subset of n samples (c correct): the share containing a correct one."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(samples[i] for i in subset) for subset in subsets), len(subsets))


@given(st.integers(1, 9).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_equals_enumeration_over_subsets(args):
    """Guards against a pass@k formula that drifts from its definition: the unbiased estimator equals
    brute-force enumeration over every k-subset."""
    n, c, k = args
    assert pass_at_k(n, c, k) == pytest.approx(float(brute_force_pass_at_k(n, c, k)), abs=1e-12)


def test_pass_at_k_hand_values():
    """n=4, c=1: pass@1 = 1/4; pass@2 = 1 − C(3,2)/C(4,2) = 1 − 3/6 = 0.5; c=0 gives 0."""
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 3, 2) == 1.0


def test_pass_at_k_rejects_impossible_counts():
    """Guards against pass@k returning a number for more correct samples than samples (c > n), which hides a
    counting bug upstream."""
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(3, 4, 1)


def correct_is(reference):
    return lambda answer: answer == reference


def test_maj_at_k_clear_majority():
    """Guards against maj@k scoring any correct vote instead of the majority answer."""
    assert maj_at_k(["5", "5", "7", None], correct_is("5")) == 1.0
    assert maj_at_k(["7", "7", "5"], correct_is("5")) == 0.0


def test_maj_at_k_ties_score_their_expectation():
    """Guards against order-dependent tie-breaking: a 2-way tie with one correct answer is worth 1/2."""
    assert maj_at_k(["5", "7"], correct_is("5")) == pytest.approx(0.5)
    assert maj_at_k(["7", "5"], correct_is("5")) == pytest.approx(0.5)
    assert maj_at_k(["5", "7", "9", "5", "7", "9"], correct_is("9")) == pytest.approx(1 / 3)


def test_maj_at_k_unparseable_answers_do_not_vote():
    """Guards against unparseable answers (None) forming a winning 'majority' that hides the one real answer."""
    assert maj_at_k([None, None, "5"], correct_is("5")) == 1.0
    assert maj_at_k([None, None], correct_is("5")) == 0.0


def test_maj_at_k_groups_equivalent_spellings():
    """Guards against a majority split by spelling: 72, 72.0 and $72 are one vote bloc, so they outvote two 80s."""
    from agentic_rl.evaluation.runner import _canonical

    assert maj_at_k(["72", "72.0", "$72", "80", "80"], correct_is(str(Fraction(72))), canonical=_canonical) == 1.0


def _episode(correct: bool, calls: int, errors: int, info: dict | None = None) -> Trajectory:
    ids = list(range(7))
    spans = [Span("prompt", 0, 3), Span("policy", 3, 7)]
    return Trajectory(
        ids,
        [0, 0, 0, 1, 1, 1, 1],
        [0.0] * 7,
        spans,
        finish_reason="answered",
        info={"correct": correct, "format_ok": True, "tool_calls": calls, "tool_errors": errors, **(info or {})},
    )


def test_episode_statistics_hand_values():
    """Guards against wrong report metrics, checked on hand-computed values: pass@1, tool calls and success
    rate, solution steps, accuracy per difficulty."""
    trajs = [
        _episode(True, 2, 0, {"solution_steps_matched": 2, "solution_steps_total": 2}),
        _episode(False, 3, 1, {"solution_steps_matched": 1, "solution_steps_total": 2}),
        _episode(False, 1, 1, {"solution_steps_matched": 0, "solution_steps_total": 4}),
    ]
    tasks = [Task(f"t/{i}", "q", "1", {"difficulty": d}) for i, d in enumerate([1, 2, 2])]
    stats = episode_statistics(trajs, tasks)
    assert stats["pass@1"] == pytest.approx(1 / 3)
    assert stats["tool_calls_per_episode"] == pytest.approx(2.0)
    assert stats["tool_success_rate"] == pytest.approx(4 / 6)
    assert stats["solution_steps"] == pytest.approx((1 + 0.5 + 0) / 3)
    assert stats["accuracy/difficulty_1"] == 1.0 and stats["accuracy/difficulty_2"] == 0.0
    # tasks that list no reference steps: no solution_steps metric rather than a 0
    assert "solution_steps" not in episode_statistics([_episode(True, 1, 0)], tasks[:1])
    assert stats["truncated_rate"] == 0.0


def test_truncated_rate_counts_the_episodes_a_rollout_limit_cut_off():
    """Guards against a truncation rate that misses a limit: max_episode_tokens, max_turns and max_turn_tokens
    count; answered, env_done and error do not."""
    reasons = ["answered", "max_episode_tokens", "max_turns", "max_turn_tokens", "env_done", "error"]
    trajs = [dataclasses.replace(_episode(False, 1, 0), finish_reason=reason) for reason in reasons]
    tasks = [Task(f"t/{i}", "q", "1", {}) for i in range(len(reasons))]
    stats = episode_statistics(trajs, tasks)
    assert stats["truncated_rate"] == pytest.approx(3 / 6)
    assert stats["finish_reasons"] == {reason: pytest.approx(1 / 6) for reason in sorted(reasons)}


def test_sampled_metrics_histogram_and_per_problem_counts():
    """Three problems, k = 4: solved 4/4, 1/4 and 0/4. Only the middle one ("sometimes") gives a
    GRPO group with reward variance; the histogram must say so."""
    from agentic_rl.evaluation.runner import sampled_metrics

    outcomes = [[True] * 4, [False, True, False, False], [False] * 4]
    trajs = [_episode(c, 1, 0, {"final_answer": "1" if c else "2"}) for group in outcomes for c in group]
    tasks = [Task(f"t/{i}", "q", "1", {}) for i in range(3)]
    metrics, counts, maj = sampled_metrics(trajs, tasks, 4)
    assert counts == [4, 1, 0]
    assert (metrics["solved/never"], metrics["solved/sometimes"], metrics["solved/always"]) == (1, 1, 1)
    assert metrics["sampled_accuracy@T"] == pytest.approx(5 / 12)
    assert metrics["pass@4"] == pytest.approx(2 / 3)
    assert maj == [1.0, 0.0, 0.0] and metrics["maj@4"] == pytest.approx(1 / 3)


def test_evaluate_records_each_problems_outcome_and_tool_calls(monkeypatch):
    """Guards against a per-problem record that loses the greedy episode's tool calls (in `plan`, the
    length of the plan it walked), which `compare` pairs by task id: each problem's entry is its own
    episode's, in task order."""
    import torch

    from agentic_rl.evaluation import runner
    from agentic_rl.evaluation.config import EvalConfig
    from agentic_rl.envs.base import EnvSpec

    episodes = [_episode(True, 5, 1), _episode(False, 12, 4), _episode(True, 7, 0)]
    monkeypatch.setattr(runner, "_run", lambda model, tokenizer, cfg, tasks, **kw: episodes[: len(tasks)])
    cfg = EvalConfig(env=EnvSpec(name="plan", options={"difficulty": 1, "branching": 1}), n=3)
    result = runner.evaluate(torch.nn.Linear(1, 1), None, cfg, progress=False)
    ids = [task.id for task in cfg.env.make().tasks("test", n=3, seed=0)]
    assert result["per_task"] == {"id": ids, "greedy": [1, 0, 1], "tool_calls": [5, 12, 7]}
    assert result["tool_calls_per_episode"] == pytest.approx(8.0) and result["pass@1"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("env, votes", [("plan", False), ("arith", True)])
def test_maj_at_k_is_left_out_where_episodes_have_no_final_answer(monkeypatch, env, votes):
    """Guards against a maj@k of 0 on plan, whose episodes succeed by reaching the goal and never give
    a final answer, so there is nothing to vote on: plan's evaluation reports pass@k and sampled
    accuracy, and no maj@k (in the metrics, per_task, the intervals, the report or compare); an
    env with final answers keeps it. Three problems, k = 2: sampled outcomes 2/2, 1/2, 0/2."""
    import torch

    from agentic_rl.envs.base import EnvSpec
    from agentic_rl.evaluation import runner
    from agentic_rl.evaluation.compare import compare_evaluations
    from agentic_rl.evaluation.config import EvalConfig
    from agentic_rl.evaluation.report import _with_ci

    greedy = [_episode(True, 5, 0), _episode(False, 12, 0), _episode(False, 7, 0)]
    sampled = [_episode(c, 5, 0) for c in (True, True, True, False, False, False)]
    monkeypatch.setattr(
        runner,
        "_run",
        lambda model, tokenizer, cfg, tasks, temperature, **kw: (greedy if temperature == 0.0 else sampled)[
            : len(tasks)
        ],
    )
    cfg = EvalConfig(env=EnvSpec(name=env, options={}), n=3, k=2)
    result = runner.evaluate(torch.nn.Linear(1, 1), None, cfg, progress=False)
    assert result["pass@2"] == pytest.approx(2 / 3) and result["sampled_accuracy@T"] == pytest.approx(0.5)
    assert ("maj@2" in result) is votes and ("maj" in result["per_task"]) is votes
    assert ("maj@2" in result["ci95"]) is votes
    assert [row["metric"] for row in compare_evaluations(result, result, "x")][:4] == [
        "pass@1",
        "sampled_accuracy@T",
        "pass@2",
    ] + (["maj@2"] if votes else ["tool calls, both solved"])
    assert (_with_ci(result, "maj@2") == "n/a") is not votes
    with pytest.raises(ValueError, match="use pass@1, sampled_accuracy@T, pass@2" + ("" if votes else "$")):
        runner.per_problem_scores(result, "maj@3")


def test_an_episode_the_env_broke_shows_its_exception_in_evals_failures(capsys):
    """Guards against an env whose `step` raises showing in `eval` as `failure (error): answered None`
    with no exception text: the failure carries the exception's type and message, and eval prints it."""
    from agentic_rl import cli
    from agentic_rl.envs.arith import ArithEnv
    from agentic_rl.envs.base import list_envs, register_env

    if "exploding_arith" not in list_envs():

        @register_env("exploding_arith")
        class ExplodingArith(ArithEnv):
            name = "exploding_arith"

            def step(self, action_text):
                raise RuntimeError("tool server exploded")

    assert (
        cli.main(["eval", "--model", "tiny-qwen3", "--env", "exploding_arith", "--n", "2", "--max-turn-tokens", "4"])
        == 0
    )
    out = capsys.readouterr().out
    assert "): error: env.step raised RuntimeError: tool server exploded" in out
    assert out.count("--- failure ") == 2 and "answered None" not in out
