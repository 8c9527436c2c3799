"""`ToolEnv`: the shared episode logic of tool-using, final-answer environments.

One policy turn goes through this decision:

    turn text ──► any <tool_call> blocks? ──yes──► run each call ──► observation: one
        │                                           {"role": "tool", "name": ..., "content": ...}
        │ no                                        per call, done=False (done if turns == max_turns)
        ▼
    `Final Answer:` present? ──yes──► grade it: done, finish="answer", reward 1.0 if correct
        │ no
        ▼
    done, finish="no_answer", format_ok=False, reward 0

A failed call (malformed JSON, unknown tool, wrong arguments, ToolError, or any exception
inside the tool) never raises: it becomes an observation starting "Error: " that says what to
fix, and it is counted in `info["tool_errors"]`. The episode continues. A python call whose
code fails (traceback, timeout, MemoryError, non-zero exit) is such a failed call. Only
`ToolUnavailable` (the host cannot run the tool at all) goes through, and stops the run.

Rewards: a correct final answer gives 1.0, everything else 0.0, plus `tool_success_reward`
per successful tool call (default 0.0) so per-step rewards exist for discounted returns.
Beware: a positive tool reward pays for tool use whether or not the answer is right; the
reward functions in `agentic_rl.rewards` can gate it on correctness instead.

Solution steps: when the task lists its reference intermediate results (`meta["steps"]` in
arith, `meta["annotations"]` in gsm8k: (expression, value) pairs), every step's info carries
`solution_steps_matched`, the length of the longest prefix of those values that the episode's
tool results reproduce in order, and `solution_steps_total`. The chain breaks at the first tool
result (errors included) that is not the next reference value, so extra or guessed calls can
only lose credit. The `solution_steps` reward term reads it.

Subclasses implement `tasks` and `oracle_actions`, and call `ToolEnv.__init__` with their
tool names and limits.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

from agentic_rl.envs.answer import answers_match, extract_final_answer
from agentic_rl.envs.base import Env, StepResult, Task
from agentic_rl.errors import quoted
from agentic_rl.tools.base import ToolError, ToolUnavailable, get_tool
from agentic_rl.tools.parse import ToolCall, parse_tool_calls

MAX_CALLS_PER_TURN = 8
"""Calls beyond this many in one turn are not run; each gets an error observation."""
MAX_OBSERVATION_CHARS = 2000
"""A longer tool result is cut to this many characters (with a note) to bound the context."""

SYSTEM_PROMPT = (
    "Solve the problem step by step. Write each step on its own line as `Step 1: ...`, "
    "`Step 2: ...`, and so on. To compute something, call a tool ({tool_names}) with a "
    "<tool_call>...</tool_call> block and wait for its result. When you know the answer, end "
    "with a line `Final Answer: <number>` and no tool call."
)


class ToolEnv(Env):
    """A final-answer task solved in turns, with tools. Stateful: one episode at a time."""

    def __init__(self, tool_names: list[str] | tuple[str, ...], max_turns: int, tool_success_reward: float = 0.0):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}; the answer needs a turn")
        if isinstance(tool_names, str) or not isinstance(tool_names, (list, tuple)):
            raise ValueError(f"tools must be a list of tool names, e.g. ['calculator'], got {quoted(tool_names)}")
        if not tool_names:
            raise ValueError("a ToolEnv needs at least one tool, e.g. ['calculator']")
        self.tools = [get_tool(name) for name in tool_names]
        self._tools_by_name = {tool.name: tool for tool in self.tools}
        self.max_turns = max_turns
        self.tool_success_reward = tool_success_reward
        self._task: Task | None = None
        self._done = True

    # --- episode ---------------------------------------------------------------------------

    @property
    def system_prompt(self) -> str:
        return SYSTEM_PROMPT.format(tool_names=", ".join(self._tools_by_name))

    @property
    def task(self) -> Task | None:
        return self._task

    def reset(self, task: Task) -> list[dict[str, Any]]:
        self._task = task
        self._done = False
        self._turns = 0
        self._attempt_turns = 0
        self._tool_calls = 0
        self._tool_errors = 0
        self._reference_steps = reference_step_values(task)
        self._steps_matched = 0
        self._chain_broken = False
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": task.question},
        ]

    def resume(self) -> None:
        """Reopen a finished episode for another attempt (used by the self-correction wrapper).

        Episode totals keep counting; the `max_turns` budget starts again.
        """
        if self._task is None:
            raise RuntimeError("resume() before reset(): there is no episode to continue")
        self._done = False
        self._attempt_turns = 0

    def step(self, action_text: str) -> StepResult:
        if self._task is None or self._done:
            raise RuntimeError("step() called with no episode running; call reset(task) first")
        self._turns += 1
        self._attempt_turns += 1
        calls = parse_tool_calls(action_text)
        if calls:
            observation, succeeded = self._run_calls(calls)
            n_ok = sum(succeeded)
            n_errors = len(calls) - n_ok
            reward = self.tool_success_reward * n_ok
            self._match_solution_steps(observation, succeeded)
            step_info = {"step_tool_calls": len(calls), "step_tool_errors": n_errors, **self._solution_info()}
            if self._attempt_turns >= self.max_turns:
                return self._finish(None, "max_turns", reward, step_info)
            info = {"tool_calls": len(calls), "tool_errors": n_errors, **step_info}
            return StepResult(observation, reward, False, info)
        answer = extract_final_answer(action_text)
        step_info = {"step_tool_calls": 0, "step_tool_errors": 0, **self._solution_info()}
        return self._finish(answer, "answer" if answer is not None else "no_answer", 0.0, step_info)

    def _finish(self, answer: str | None, finish: str, reward: float, step_info: dict[str, Any]) -> StepResult:
        assert self._task is not None, "episode state lost: _finish without a task"
        self._done = True
        correct = answer is not None and answers_match(answer, self._task.answer)
        info = {
            **step_info,
            "correct": correct,
            "final_answer": answer,
            "reference": self._task.answer,
            "format_ok": answer is not None,
            "tool_calls": self._tool_calls,
            "tool_errors": self._tool_errors,
            "turns": self._turns,
            "finish": finish,
        }
        return StepResult(None, reward + (1.0 if correct else 0.0), True, info)

    # --- solution steps ----------------------------------------------------------------------

    def _match_solution_steps(self, observation: list[dict[str, Any]], succeeded: list[bool]) -> None:
        """Extend the matched prefix of reference values with this turn's tool results, in order.

        A failed call breaks the chain, whatever its message says."""
        for message, ok in zip(observation, succeeded):
            if self._chain_broken or self._steps_matched >= len(self._reference_steps):
                return
            if ok and answers_match(message["content"], self._reference_steps[self._steps_matched]):
                self._steps_matched += 1
            else:
                self._chain_broken = True

    def _solution_info(self) -> dict[str, int]:
        if not self._reference_steps:
            return {}
        return {"solution_steps_matched": self._steps_matched, "solution_steps_total": len(self._reference_steps)}

    # --- tools -----------------------------------------------------------------------------

    def _run_calls(self, calls: list[ToolCall]) -> tuple[list[dict[str, Any]], list[bool]]:
        """One observation message per call, and whether each call succeeded. The calls of a turn
        run concurrently (each python call is its own sandboxed process), so a turn of slow calls
        costs about one call's time, not their sum; observations keep the calls' order."""
        observation, succeeded = [], []
        ran = calls[:MAX_CALLS_PER_TURN]
        if len(ran) > 1:
            with concurrent.futures.ThreadPoolExecutor(max_workers=len(ran)) as pool:
                results = list(pool.map(self._run_call, ran))
        else:
            results = [self._run_call(call) for call in ran]
        results += [("error", f"Error: at most {MAX_CALLS_PER_TURN} tool calls per turn; this one was not run", False)] * (len(calls) - len(ran))
        for name, content, ok in results:
            observation.append({"role": "tool", "name": name, "content": content})
            succeeded.append(ok)
        self._tool_calls += len(calls)
        self._tool_errors += succeeded.count(False)
        return observation, succeeded

    def _run_call(self, call: ToolCall) -> tuple[str, str, bool]:
        """(observation name, content, succeeded) for one parsed call; never raises."""
        if not call.ok:
            return "error", f"Error: {call.error}", False
        tool = self._tools_by_name.get(call.name or "")
        if tool is None:
            available = ", ".join(self._tools_by_name)
            return "error", f"Error: unknown tool {call.name!r}; available tools: {available}", False
        try:
            result = tool.call(call.arguments)
        except ToolError as exc:
            return tool.name, f"Error: {exc}", False
        except ToolUnavailable:
            raise  # the host cannot run the tool: stop the run, do not train on a dead tool
        except Exception as exc:  # noqa: BLE001 - a tool bug must not end the episode
            return tool.name, f"Error: tool {tool.name!r} failed: {type(exc).__name__}: {exc}", False
        if len(result) > MAX_OBSERVATION_CHARS:
            result = result[:MAX_OBSERVATION_CHARS] + f"\n[output cut at {MAX_OBSERVATION_CHARS} characters]"
        return tool.name, result, True


def reference_step_values(task: Task) -> list[str]:
    """The reference solution's intermediate results, in order ([] if the task lists none)."""
    steps = task.meta.get("steps") or task.meta.get("annotations") or []
    return [str(value) for _expression, value in steps]
