"""ToolEnv: tool calls, error observations, grading, turn limits and per-step rewards."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentic_rl.envs.base import Task
from agentic_rl.envs.tool_env import MAX_CALLS_PER_TURN, ToolEnv
from agentic_rl.tools.base import Tool
from agentic_rl.tools.parse import format_tool_call

TASK = Task("t/0", "Natalia sold 48 clips in April and half as many in May. How many in total?", "72")


def _boom(expression: str) -> str:
    """A tool with a bug.

    Args:
        expression: Anything.
    """
    raise RuntimeError("internal failure")


class _Env(ToolEnv):
    name = "test_tool_env"

    def __init__(self, max_turns: int = 4, tool_success_reward: float = 0.0):
        super().__init__(["calculator"], max_turns, tool_success_reward)
        boom = Tool.from_function(_boom, name="boom")
        self.tools.append(boom)
        self._tools_by_name["boom"] = boom


def _calc(expression: str) -> str:
    return format_tool_call("calculator", {"expression": expression})


@pytest.fixture
def env() -> _Env:
    environment = _Env()
    environment.reset(TASK)
    return environment


def test_reset_returns_system_and_user_messages_without_schema_json() -> None:
    """Guards against the tool schema JSON being duplicated in the system prompt."""
    env = _Env()
    messages = env.reset(TASK)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[1]["content"] == TASK.question
    assert "Final Answer:" in messages[0]["content"] and "Step 1:" in messages[0]["content"]
    assert '"parameters"' not in messages[0]["content"]
    assert [s["function"]["name"] for s in env.tool_schemas] == ["calculator", "boom"]


def test_valid_call_returns_tool_observation_and_episode_continues(env: _Env) -> None:
    """Guards against a tool call that ends the episode or whose result is lost: the calculator's value comes
    back as one tool message."""
    result = env.step("Step 1: half of 48.\n" + _calc("48/2"))
    assert result.observation == [{"role": "tool", "name": "calculator", "content": "24"}]
    assert not result.done and result.reward == 0.0
    assert result.info["tool_calls"] == 1 and result.info["tool_errors"] == 0


def test_two_calls_in_one_turn_give_two_observations_in_order(env: _Env) -> None:
    """Guards against only the first of several calls in a turn being run, or their results arriving out of order."""
    result = env.step(_calc("48/2") + "\n" + _calc("48+24"))
    assert [m["content"] for m in result.observation] == ["24", "72"]


@pytest.mark.parametrize(
    ("turn", "name", "content_part"),
    [
        (
            '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}\n</tool_call>',
            "error",
            "not valid JSON",
        ),
        (
            "<tool_call>\n" + json.dumps({"name": "calc", "arguments": {"expression": "1"}}) + "\n</tool_call>",
            "error",
            "unknown tool 'calc'; available tools: calculator, boom",
        ),
        (
            "<tool_call>\n" + json.dumps({"name": "calculator", "arguments": {}}) + "\n</tool_call>",
            "calculator",
            "missing required argument(s) ['expression']",
        ),
        (
            "<tool_call>\n" + json.dumps({"name": "calculator", "arguments": {"expr": "1"}}) + "\n</tool_call>",
            "calculator",
            "unknown argument(s) ['expr']",
        ),
        (
            "<tool_call>\n" + json.dumps({"name": "calculator", "arguments": {"expression": 5}}) + "\n</tool_call>",
            "calculator",
            "must be string",
        ),
        (_calc("1/0"), "calculator", "division by zero"),
        (format_tool_call("boom", {"expression": "1"}), "boom", "RuntimeError: internal failure"),
        ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "1"}}', "error", "unterminated"),
    ],
)
def test_failed_call_becomes_error_observation_and_episode_continues(
    env: _Env, turn: str, name: str, content_part: str
) -> None:
    """Guards against malformed calls or tool bugs crashing the episode or going uncounted."""
    result = env.step(turn)
    assert not result.done
    assert len(result.observation) == 1
    observation = result.observation[0]
    assert observation["role"] == "tool" and observation["name"] == name
    assert observation["content"].startswith("Error: ") and content_part in observation["content"]
    assert result.info["tool_calls"] == 1 and result.info["tool_errors"] == 1
    final = env.step("Final Answer: 72")
    assert final.done and final.info["correct"]
    assert final.info["tool_calls"] == 1 and final.info["tool_errors"] == 1


def test_correct_answer_ends_episode_with_summary_and_reward(env: _Env) -> None:
    """Guards against a correct answer that does not end the episode, or an end-of-episode info missing counts
    the rewards and reports read."""
    env.step(_calc("48/2"))
    env.step(_calc("48+24"))
    result = env.step("Step 3: 48 + 24 = 72\nFinal Answer: 72 clips")
    assert result.done and result.observation is None and result.reward == 1.0
    assert result.info == {
        "step_tool_calls": 0,
        "step_tool_errors": 0,
        "correct": True,
        "final_answer": "72",
        "reference": "72",
        "format_ok": True,
        "tool_calls": 2,
        "tool_errors": 0,
        "turns": 3,
        "finish": "answer",
        "score": 1.0,
    }


def test_wrong_answer_ends_episode_with_zero_reward(env: _Env) -> None:
    """Guards against a wrong answer earning reward, or being counted as a format failure when its format was fine."""
    result = env.step("Final Answer: 71")
    assert result.done and result.reward == 0.0
    assert result.info["correct"] is False and result.info["format_ok"] is True


def test_turn_without_call_or_answer_ends_episode_with_format_failure(env: _Env) -> None:
    """Guards against a turn with neither a call nor an answer looping until max_turns instead of ending as a
    format failure."""
    result = env.step("I think it is about seventy.")
    assert result.done and result.reward == 0.0
    assert result.info["format_ok"] is False and result.info["finish"] == "no_answer"
    assert result.info["final_answer"] is None


def test_max_turns_ends_episode_without_answer() -> None:
    """Guards against a policy that only calls tools looping forever."""
    env = _Env(max_turns=3)
    env.reset(TASK)
    assert not env.step(_calc("1+1")).done
    assert not env.step(_calc("1+1")).done
    result = env.step(_calc("1+1"))
    assert result.done and result.observation is None
    assert result.info["finish"] == "max_turns" and result.info["turns"] == 3
    assert result.info["tool_calls"] == 3 and not result.info["correct"]


def test_tool_success_reward_is_paid_per_successful_call() -> None:
    """Guards against a tool reward that pays failed calls: 0.1 per call that worked, none for the division by zero."""
    env = _Env(tool_success_reward=0.1)
    env.reset(TASK)
    result = env.step(_calc("48/2") + _calc("1/0") + _calc("2*3"))
    assert result.reward == pytest.approx(0.2)
    assert result.info["tool_calls"] == 3 and result.info["tool_errors"] == 1


def test_calls_beyond_the_per_turn_cap_are_not_run(env: _Env) -> None:
    """Guards against a turn flooding the env with calls: calls past the per-turn cap are not run and each is
    reported as an error."""
    result = env.step(_calc("1+1") * (MAX_CALLS_PER_TURN + 2))
    contents = [m["content"] for m in result.observation]
    assert contents[:MAX_CALLS_PER_TURN] == ["2"] * MAX_CALLS_PER_TURN
    assert all("not run" in c for c in contents[MAX_CALLS_PER_TURN:])
    assert result.info["tool_errors"] == 2


def test_step_after_done_or_before_reset_raises() -> None:
    """Guards against an env that accepts steps before reset or after the episode ended, mixing state between
    episodes."""
    env = _Env()
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("Final Answer: 1")
    env.reset(TASK)
    env.step("Final Answer: 1")
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("Final Answer: 1")


_TEXT = st.text(max_size=200) | st.lists(
    st.sampled_from(
        [
            "<tool_call>",
            "</tool_call>",
            "{",
            "}",
            '"name"',
            '"calculator"',
            '"arguments"',
            ":",
            ",",
            '"expression"',
            '"1/0"',
            '"2**99**9"',
            "Final Answer:",
            "72",
            "\n",
            "[",
            "null",
        ]
    ),
    max_size=30,
).map("".join)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_TEXT, min_size=1, max_size=4))
def test_arbitrary_text_never_crashes_step(turns: list[str]) -> None:
    """Guards against hostile model output raising inside the env."""
    env = _Env(max_turns=3)
    env.reset(TASK)
    for turn in turns:
        result = env.step(turn)
        assert isinstance(result.reward, float)
        if result.done:
            assert {"correct", "format_ok", "tool_calls", "tool_errors", "turns"} <= set(result.info)
            break
        assert all(m["role"] == "tool" for m in result.observation)


STEPS_TASK = Task(
    "t/1", "48 clips, sold half, then 7 more arrive.", "31", {"steps": [("48 / 2", "24"), ("24 + 7", "31")]}
)


def _solution(env: _Env, *turns: str) -> list[tuple[int, int]]:
    env.reset(STEPS_TASK)
    out = []
    for turn in turns:
        info = env.step(turn).info
        out.append((info["solution_steps_matched"], info["solution_steps_total"]))
    return out


def test_solution_steps_count_the_matched_chain_of_reference_values() -> None:
    """Guards against the step reward paying for guesses: only an unbroken chain of reference values counts,
    checked by value not by expression."""
    env = _Env(max_turns=5)
    # one step per turn, then the answer: the count rises with each right result
    assert _solution(env, _calc("48/2"), _calc("24 + 7"), "Final Answer: 31") == [(1, 2), (2, 2), (2, 2)]
    # both steps in one turn; equal values from other expressions count (the value is checked)
    assert _solution(env, _calc("12*2") + _calc("31")) == [(2, 2)]
    # a wrong first result breaks the chain: later right results earn nothing
    assert _solution(env, _calc("48*2"), _calc("48/2"), _calc("24+7")) == [(0, 2)] * 3
    # so does a failed call, and a guess after a right step
    assert _solution(env, _calc("48/2"), _calc("1/0"), _calc("24+7")) == [(1, 2)] * 3
    assert _solution(env, _calc("48/2") + _calc("25") + _calc("31")) == [(1, 2)]
    # calls after the whole chain matched change nothing
    assert _solution(env, _calc("48/2") + _calc("24+7") + _calc("5")) == [(2, 2)]


def test_a_task_without_reference_steps_reports_none(env: _Env) -> None:
    """Guards against a task without reference steps reporting 0 matched steps, which would read as a failure
    instead of 'not measured'."""
    info = env.step(_calc("48/2")).info
    assert "solution_steps_matched" not in info and "solution_steps_total" not in info


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["24", "31", "25", "1/0"]), min_size=1, max_size=6), st.integers(1, 3))
def test_solution_steps_equal_the_common_prefix(results: list[str], per_turn: int) -> None:
    """The matched count is the longest common prefix of the tool results and the reference
    values, however the calls are split into turns."""
    env = _Env(max_turns=len(results) + 1)
    env.reset(STEPS_TASK)
    info: dict = {}
    for start in range(0, len(results), per_turn):
        info = env.step("".join(_calc(r) for r in results[start : start + per_turn])).info
    expected = 0
    for got, want in zip(results, ["24", "31"]):
        if got != want:
            break
        expected += 1
    assert info["solution_steps_matched"] == expected


def _nap(seconds: float) -> str:
    """A slow tool (test only).

    Args:
        seconds: How long to sleep.
    """
    import time

    time.sleep(seconds)
    return f"slept {seconds}"


def test_the_calls_of_one_turn_run_concurrently_and_keep_their_order() -> None:
    """Four 0.5 s calls in one turn take about 0.5 s, not 2 s (a turn of slow python calls used to
    hold the whole batch for their sum), and each observation stays with its call."""
    import time

    environment = _Env()
    nap = Tool.from_function(_nap, name="nap")
    environment.tools.append(nap)
    environment._tools_by_name["nap"] = nap
    environment.reset(TASK)
    turn = "".join(format_tool_call("nap", {"seconds": s}) for s in (0.5, 0.4, 0.5, 0.3)) + _calc("6*7")
    started = time.perf_counter()
    result = environment.step(turn)
    elapsed = time.perf_counter() - started
    assert [m["content"] for m in result.observation] == ["slept 0.5", "slept 0.4", "slept 0.5", "slept 0.3", "42"]
    assert elapsed < 1.2, f"the calls ran one after another ({elapsed:.2f} s)"
