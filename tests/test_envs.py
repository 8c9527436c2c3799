"""The arith, gsm8k and self_correct environments and the oracle runner."""

from __future__ import annotations

from fractions import Fraction

import pytest

from agentic_rl.envs.arith import HELD_OUT_TEMPLATES, SEEN_TEMPLATES, TEMPLATES
from agentic_rl.envs.base import list_envs, make_env
from agentic_rl.envs.oracle import play_oracle, run_oracle, run_oracle_episodes
from agentic_rl.envs.self_correction import RETRY_MESSAGE
from agentic_rl.tools.calculator import evaluate


def test_builtin_envs_are_registered() -> None:
    """Guards against a built-in env (arith, gsm8k, self_correct) missing from the registry, so a config naming
    it would fail."""
    assert {"arith", "gsm8k", "self_correct"} <= set(list_envs())


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("arith", {"difficulty": 6}, "difficulty must be"),
        ("arith", {"difficulty": [0, 1]}, "difficulty must be"),
        ("arith", {"templates": ["pirates"]}, "unknown or no template"),
        ("arith", {"min_value": 10, "max_value": 5}, "min_value <= max_value"),
        ("arith", {"colour": "red"}, "unknown option"),
        ("gsm8k", {"tools": ["abacus"]}, "gsm8k tools must be"),
        ("self_correct", {"decay": 0.0}, r"'options.decay' must be in \(0, 1\], got 0.0"),
        ("textarena", {"max_turns": 0}, "'options.max_turns' must be > 0, got 0"),
        ("plan", {"step_cost": -0.5}, "'options.step_cost' must be >= 0, got -0.5"),
        ("gsm8k", {"max_steps": 0}, "'options.max_steps' must be > 0, got 0"),
        ("self_correct", {"base": "self_correct"}, "cannot wrap itself"),
        ("self_correct", {"base_options": {"colour": "red"}}, "unknown option"),
    ],
)
def test_bad_options_are_rejected(name: str, options: dict, message: str) -> None:
    """Guards against settings that are silently ignored (design invariant 6)."""
    with pytest.raises(ValueError, match=message):
        make_env(name, **options)


def test_arith_tasks_are_deterministic_per_seed() -> None:
    """Guards against task lists that change between runs with one seed (invariant 7), and against seeds that do
    not change them."""
    env = make_env("arith", difficulty=[1, 2, 3, 4, 5])
    first = env.tasks("train", n=50, seed=3)
    assert first == make_env("arith", difficulty=[1, 2, 3, 4, 5]).tasks("train", n=50, seed=3)
    assert [t.id for t in first[:2]] == ["arith/train/3/0", "arith/train/3/1"]
    assert [t.question for t in first] != [t.question for t in env.tasks("train", n=50, seed=4)]


def _math_key(task) -> tuple:
    return task.meta["template"], tuple(task.meta["steps"])


def test_arith_train_and_test_splits_never_overlap() -> None:
    """Guards against test problems leaking into training, even across seeds."""
    env = make_env("arith", difficulty=[1, 2], max_value=20)
    train = {_math_key(t) for t in env.tasks("train", n=2000, seed=0)}
    test = {_math_key(t) for t in env.tasks("test", n=2000, seed=1)}
    assert len(train) > 500 and len(test) > 500
    assert not train & test


@pytest.mark.parametrize("difficulty", [1, 2, 3, 4, 5])
def test_arith_steps_are_exact_positive_integers_and_oracle_solves_all(difficulty: int) -> None:
    """Guards against inexact division, negative results, or an unsolvable difficulty."""
    env = make_env("arith", difficulty=difficulty)
    for split in ("train", "test"):
        tasks = env.tasks(split, n=100, seed=0)
        for task in tasks:
            assert task.meta["difficulty"] == len(task.meta["steps"]) == difficulty
            for expression, value in task.meta["steps"]:
                exact = evaluate(expression)
                assert exact == Fraction(int(value)) and exact >= 1, (task.question, expression)
            assert task.answer == task.meta["steps"][-1][1]
        summary = run_oracle_episodes(env, tasks)
        assert summary["accuracy"] == 1.0 and summary["tool_errors"] == 0, summary
        assert summary["tool_calls"] == 100 * difficulty and summary["mean_turns"] == difficulty + 1
        assert summary["step_mismatches"] == 0


def test_arith_templates_option_restricts_stories() -> None:
    """Guards against held-out templates leaking into the seen set, or the templates/difficulty options being
    ignored."""
    assert len(TEMPLATES) >= 6 and not set(SEEN_TEMPLATES) & set(HELD_OUT_TEMPLATES)
    env = make_env("arith", templates=list(HELD_OUT_TEMPLATES), difficulty=[2, 3])
    tasks = env.tasks("test", n=200)
    assert {t.meta["template"] for t in tasks} == set(HELD_OUT_TEMPLATES)
    assert {t.meta["difficulty"] for t in tasks} == {2, 3}


def test_arith_oracle_turns_write_steps_then_final_answer() -> None:
    """Guards against SFT demonstrations in the wrong shape: one `Step k:` turn with a calculator call per step,
    then the final answer."""
    env = make_env("arith", difficulty=2)
    task = env.tasks("train", n=1)[0]
    turns = env.oracle_actions(task)
    assert len(turns) == 3
    assert turns[0].startswith("Step 1:") and '"name": "calculator"' in turns[0]
    assert turns[-1].startswith("Step 3:") and turns[-1].endswith(f"Final Answer: {task.answer}")


def test_gsm8k_oracle_solves_first_200_training_problems_without_tool_errors() -> None:
    """Guards against a GSM8K env, annotation parser or calculator that cannot reproduce the reference solutions
    (its SFT data would be wrong)."""
    summary = run_oracle("gsm8k", n=200, split="train")
    assert summary["n"] == 200 and summary["accuracy"] == 1.0
    assert summary["tool_errors"] == 0 and summary["step_mismatches"] == 0
    assert summary["tool_calls"] == 675  # the annotations in the first 200 problems


def test_gsm8k_task_meta_and_subset_options() -> None:
    """Guards against the n/offset options being ignored, lost task meta (steps, annotations), and a seeded
    shuffle that is not reproducible."""
    env = make_env("gsm8k", n=5, offset=2)
    tasks = env.tasks("train")
    assert [t.id for t in tasks] == [f"gsm8k/train/{i}" for i in range(2, 7)]
    first = make_env("gsm8k").tasks("train", n=1)[0]
    assert first.answer == "72" and first.meta["n_steps"] == 2
    assert first.meta["annotations"] == [("48/2", "24"), ("48+24", "72")]
    shuffled = make_env("gsm8k").tasks("test", n=3, seed=7)
    assert shuffled == make_env("gsm8k").tasks("test", n=3, seed=7)
    assert [t.id for t in shuffled] != ["gsm8k/test/0", "gsm8k/test/1", "gsm8k/test/2"]


def test_gsm8k_max_steps_keeps_the_short_problems_before_offset_and_n() -> None:
    """Guards against a curriculum option that is ignored, filters after n (fewer problems than asked)
    or counts steps differently from the task meta."""
    env = make_env("gsm8k", max_steps=2, n=4, offset=1)
    tasks = env.tasks("train")
    # train problems 0..11 take 2, 2, 3, 4, 3, 5, 3, 3, 2, 7, 2, 5 steps: those of <= 2 are 0, 1, 8, 10, ...
    assert [t.id for t in tasks[:3]] == ["gsm8k/train/1", "gsm8k/train/8", "gsm8k/train/10"]
    assert len(tasks) == 4 and all(t.meta["n_steps"] <= 2 for t in tasks)
    assert len(make_env("gsm8k", max_steps=2).tasks("train")) == 404 + 2198  # 1- and 2-step problems
    with pytest.raises(ValueError, match="max_steps"):
        make_env("gsm8k", max_steps=0)


def test_gsm8k_oracle_packs_long_solutions_into_max_turns() -> None:
    """Guards against the oracle running out of turns on the longest (9-line) solutions."""
    env = make_env("gsm8k", max_turns=3)
    long_tasks = [t for t in env.tasks("train", n=400) if len(t.meta["annotations_by_line"]) > 2][:20]
    assert long_tasks
    summary = run_oracle_episodes(env, long_tasks)
    assert summary["accuracy"] == 1.0 and summary["mean_turns"] == 3


def test_gsm8k_offers_the_python_tool() -> None:
    """Guards against the tools option being ignored: gsm8k with tools=[python] offers only python, and its
    oracle solves with it."""
    env = make_env("gsm8k", tools=["python"], n=1)
    assert [s["function"]["name"] for s in env.tool_schemas] == ["python"]
    summary = run_oracle_episodes(env, env.tasks("train"))
    assert summary["accuracy"] == 1.0 and summary["tool_calls"] == 2, summary


def test_self_correction_decays_reward_by_attempt() -> None:
    """Hand-computed: wrong, wrong, right with decay 0.5 gives 0.5**2 = 0.25 on attempt 3."""
    env = make_env("self_correct", base="arith", base_options={"difficulty": 1}, max_retries=2, decay=0.5)
    task = env.tasks("test", n=1)[0]
    env.reset(task)
    wrong = str(int(task.answer) + 1)
    first = env.step(f"Final Answer: {wrong}")
    assert not first.done and first.reward == 0.0
    assert first.observation == [{"role": "user", "content": RETRY_MESSAGE}]
    assert task.answer not in RETRY_MESSAGE
    assert not env.step(f"Final Answer: {wrong}").done
    last = env.step(f"Final Answer: {task.answer}")
    assert last.done and last.reward == 0.25 and last.info["attempts"] == 3 and last.info["correct"]


def test_self_correction_ends_after_max_retries_and_pays_full_on_first_try() -> None:
    """Guards against a self-correction wrapper that retries forever or pays a retried answer as much as a
    first-try one."""
    env = make_env("self_correct", base_options={"difficulty": 1}, max_retries=1, decay=0.5)
    task = env.tasks("test", n=1)[0]
    env.reset(task)
    assert not env.step("Final Answer: -1").done
    result = env.step("Final Answer: -1")
    assert result.done and result.reward == 0.0 and result.info["attempts"] == 2
    env.reset(task)
    result = env.step(f"Final Answer: {task.answer}")
    assert result.done and result.reward == 1.0 and result.info["attempts"] == 1


def test_oracle_runner_summarizes_through_the_env_api() -> None:
    """Guards against an oracle runner that bypasses the Env API: a wrapped env runs through reset/step and the
    summary has every field."""
    summary = run_oracle("self_correct", n=20, split="test", seed=2, base_options={"difficulty": [1, 2]})
    assert summary["env"] == "self_correct" and summary["n"] == 20
    assert summary["accuracy"] == 1.0 and summary["tool_errors"] == 0 and summary["failures"] == []
    assert set(summary) >= {"accuracy", "n", "tool_calls", "tool_errors", "mean_turns"}


def _arith_with_oracle(edit):
    """A difficulty-2 arith env and task whose oracle turns are `edit(true oracle turns)`."""
    env = make_env("arith", difficulty=2)
    task = env.tasks("train", n=1, seed=0)[0]
    turns = env.oracle_actions(task)
    env.oracle_actions = lambda _task: edit(turns)
    return env, task


def test_play_oracle_returns_the_conversation_final_result_and_tool_results() -> None:
    """Guards the one oracle loop shared by `envs oracle` and SFT demos: every turn goes through
    env.step, observations follow their turn, and nothing follows the turn that ended it."""
    env = make_env("arith", difficulty=2)
    task = env.tasks("train", n=1, seed=0)[0]
    episode = play_oracle(env, task)
    roles = [message["role"] for message in episode.conversation]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert [m["content"] for m in episode.conversation if m["role"] == "assistant"] == env.oracle_actions(task)
    assert episode.tool_results == [value for _expression, value in task.meta["steps"]]
    assert episode.result is not None and episode.result.done and episode.result.info["correct"]
    assert episode.turns_played == episode.turns_planned == 3


@pytest.mark.parametrize(
    ("edit", "correct", "turns", "failure"),
    [
        (lambda turns: turns + ["Final Answer: 0"], True, 3, "episode ended after 3 of 4 oracle turns"),
        (lambda turns: turns[:-1], False, 2, "oracle turns ran out before the episode ended"),
        (lambda turns: turns[:-1] + ["Final Answer: -1"], False, 3, "graded wrong: answered '-1'"),
    ],
)
def test_oracle_episode_names_why_the_oracle_failed(edit, correct: bool, turns: int, failure: str) -> None:
    """Guards the failure reasons `agentic-rl envs oracle` lists: an oracle that outlives the
    episode, runs out of turns, or answers wrong is reported, not counted as solved."""
    env, task = _arith_with_oracle(edit)
    summary = run_oracle_episodes(env, [task])
    assert summary["accuracy"] == float(correct) and summary["mean_turns"] == turns
    assert summary["failures"] and summary["failures"][0]["reason"].startswith(failure), summary
