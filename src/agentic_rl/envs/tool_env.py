"""`ToolEnv`: the shared episode logic of tool-using, final-answer environments.

One policy turn goes through this decision:

    turn text ──► any <tool_call> blocks? ──yes──► run each call ──► observation: one
        │                                           {"role": "tool", "name": ..., "content": ...}
        │ no                                        per call, done=False (done if turns == max_turns)
        ▼
    `Final Answer:` present? ──yes──► grade it: done, finish="answer", reward = its score
        │ no
        ▼
    done, finish="no_answer", format_ok=False, reward 0

A failed call (malformed JSON, unknown tool, wrong arguments, ToolError, or any exception
inside the tool) never raises: it becomes an observation starting "Error: " that says what to
fix, and it is counted in `info["tool_errors"]`. The episode continues. A python call whose
code fails (traceback, timeout, MemoryError, non-zero exit) is such a failed call. Only
`ToolUnavailable` (the host cannot run the tool at all) goes through, and stops the run.

Rewards: a final answer earns its score, `score_answer` (1.0 when correct, else 0.0; a bridged
verifier may give partial credit), plus `tool_success_reward`
per successful tool call (default 0.0) so per-step rewards exist for discounted returns.
Beware: a positive tool reward pays for tool use whether or not the answer is right; the
reward functions in `agentic_rl.rewards` can gate it on correctness instead.

Solution steps: when the task lists its reference intermediate results (`meta["steps"]` in
arith, `meta["annotations"]` in gsm8k: (expression, value) pairs), every step's info carries
`solution_steps_matched`, the length of the longest prefix of those values that the episode's
tool results reproduce in order, and `solution_steps_total`. The chain breaks at the first tool
result (errors included) that is not the next reference value, so extra or guessed calls can
only lose credit. The `solution_steps` reward term reads it.

Stateful tools: besides registered tool names, `tools` takes the env's own bound methods
(typed, with a Google-style docstring, exactly as a registered tool): their schema is derived the
same way, and they read and change the episode's state on `self`. Inside one, `add_reward(r)`
adds r to this turn's reward r_t (a cost per move, a bonus), and `end_episode(solved)` ends the
episode after this turn, graded by `solved` instead of a final answer. An env whose episodes end
that way sets `final_answers = False`; then a turn without a call ends the episode unsolved
(finish "no_call"), since there is no answer to grade. The calls of a turn that reaches an
env method run one after another, in order (they share the env's state); only calls of
registered tools alone run concurrently. A guess-the-number game is the README's example.

Subclasses implement `tasks` and `oracle_actions`, and call `ToolEnv.__init__` with their
tools and limits.
"""

from __future__ import annotations

import concurrent.futures
import inspect
from typing import Any, Callable, Sequence

from agentic_rl.envs.answer import answers_match, extract_final_answer
from agentic_rl.envs.base import Env, StepResult, Task
from agentic_rl.errors import quoted
from agentic_rl.tools.base import Tool, get_tool
from agentic_rl.tools.dispatch import run_tool_call
from agentic_rl.tools.parse import ToolCall, parse_tool_calls

MAX_CALLS_PER_TURN = 8
"""Calls beyond this many in one turn are not run; each gets an error observation."""

SYSTEM_PROMPT = (
    "Solve the problem step by step. Write each step on its own line as `Step 1: ...`, "
    "`Step 2: ...`, and so on. To compute something, call a tool ({tool_names}) with a "
    "<tool_call>...</tool_call> block and wait for its result. When you know the answer, end "
    "with a line `Final Answer: <number>` and no tool call."
)


class ToolEnv(Env):
    """A final-answer task solved in turns, with tools. Stateful: one episode at a time."""

    def __init__(
        self,
        tools: Sequence[str | Callable[..., Any]] | None = None,
        max_turns: int = 8,
        tool_success_reward: float = 0.0,
        *,
        tool_names: Any = None,
    ):
        """`tools`: registered tool names (`agentic-rl tools run --help`) and/or this env's own
        bound methods, e.g. `["calculator", self.guess]`; `max_turns`: policy turns per episode;
        `tool_success_reward`: added to a turn's reward for each call that succeeded."""
        if tool_names is not None:
            raise TypeError(
                "ToolEnv's `tool_names` is now `tools` (names and the env's own methods): "
                f"write super().__init__(tools={list(tool_names)!r}, max_turns=...)"
            )
        tools = [] if tools is None else tools
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}; the answer needs a turn")
        if isinstance(tools, str) or not isinstance(tools, (list, tuple)):
            raise ValueError(f"tools must be a list of tool names or methods, e.g. ['calculator'], got {quoted(tools)}")
        self.tools = [self._tool(tool) for tool in tools]
        self._tools_by_name = {tool.name: tool for tool in self.tools}
        if len(self._tools_by_name) < len(self.tools):
            raise ValueError(f"two tools share a name: {[tool.name for tool in self.tools]}")
        self._stateful = {tool.name for tool, given in zip(self.tools, tools) if not isinstance(given, str)}
        self.max_turns = max_turns
        self.tool_success_reward = tool_success_reward
        self._task: Task | None = None
        self._done = True
        self._turn_reward = 0.0
        self._solved: bool | None = None

    def _tool(self, tool: str | Callable[..., Any]) -> Tool:
        if isinstance(tool, str):
            return get_tool(tool)
        if not callable(tool):
            raise ValueError(f"a tool is a registered name or a method of the env, got {quoted(tool)}")
        if not inspect.ismethod(tool) or tool.__self__ is not self:
            name = getattr(tool, "__name__", repr(tool))
            raise ValueError(
                f"tool {name!r} is neither a registered name nor a method of this env: pass self.{name} "
                f"for per-episode state, or register it with @register_tool and pass its name"
            )
        try:
            return Tool.from_function(tool)
        except Exception as exc:  # transformers' schema error names the missing hint or docstring
            raise ValueError(
                f"env method {tool.__name__!r} cannot be a tool: {exc}. A tool method needs type hints "
                f"on every argument and a Google-style docstring with an Args: section"
            ) from exc

    # --- what an env's own tools call ---------------------------------------------------------

    def add_reward(self, reward: float) -> None:
        """Add `reward` to this turn's reward r_t (call it from a tool method: a cost, a bonus)."""
        self._turn_reward += float(reward)

    def end_episode(self, solved: bool) -> None:
        """End the episode after this turn's calls, graded `solved` (correct) instead of by a final
        answer; a solved episode earns the env's success reward of 1.0, as a right answer does."""
        self._solved = bool(solved)

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
        self._turn_reward = 0.0
        self._solved = None
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
        self._solved = None

    def step(self, action_text: str) -> StepResult:
        if self._task is None or self._done:
            raise RuntimeError("step() called with no episode running; call reset(task) first")
        self._turns += 1
        self._attempt_turns += 1
        self._turn_reward = 0.0
        calls = parse_tool_calls(action_text)
        if calls:
            observation, succeeded = self._run_calls(calls)
            n_ok = sum(succeeded)
            n_errors = len(calls) - n_ok
            reward = self.tool_success_reward * n_ok + self._turn_reward
            self._match_solution_steps(observation, succeeded)
            step_info = {"step_tool_calls": len(calls), "step_tool_errors": n_errors, **self._solution_info()}
            if self._solved is not None:
                return self._finish(None, "solved" if self._solved else "failed", reward, step_info)
            if self._attempt_turns >= self.max_turns:
                return self._finish(None, "max_turns", reward, step_info)
            info = {"tool_calls": len(calls), "tool_errors": n_errors, **step_info}
            return StepResult(observation, reward, False, info)
        step_info = {"step_tool_calls": 0, "step_tool_errors": 0, **self._solution_info()}
        if not self.final_answers:  # success is a state the episode reaches: a turn without a call gives up
            return self._finish(None, "no_call", 0.0, step_info)
        answer = self.extract_answer(action_text)
        return self._finish(answer, "answer" if answer is not None else "no_answer", 0.0, step_info)

    def _finish(self, answer: str | None, finish: str, reward: float, step_info: dict[str, Any]) -> StepResult:
        assert self._task is not None, "episode state lost: _finish without a task"
        self._done = True
        if self._solved is not None:
            score = 1.0 if self._solved else 0.0
        else:
            score = self.score_answer(answer) if answer is not None else 0.0
        correct = score >= 1.0
        info = {
            **step_info,
            "correct": correct,
            "final_answer": answer,
            "reference": self._task.answer,
            "format_ok": answer is not None if self.final_answers else finish != "no_call",
            "tool_calls": self._tool_calls,
            "tool_errors": self._tool_errors,
            "turns": self._turns,
            "finish": finish,
            "score": score,
            **self.extra_episode_info(),
        }
        return StepResult(None, reward + score, True, info)

    def extra_episode_info(self) -> dict[str, Any]:
        """Facts of this env's own for the episode's summary (the last step's `info`), e.g.
        `{"hints_used": 2}`: they travel into `eval`'s records and reward terms. None by default."""
        return {}

    # --- grading: override for another answer format or partial credit ---------------------------

    def extract_answer(self, text: str) -> str | None:
        """The answer in a turn without a tool call (None: none given): the cleaned value after the
        last `Final Answer:`."""
        return extract_final_answer(text)

    def score_answer(self, answer: str) -> float:
        """The answer's score in [0, 1], paid as the last turn's reward; 1.0 counts as correct.
        Here 1.0 when it matches the task's reference numerically, else 0.0."""
        assert self._task is not None, "score_answer outside an episode"
        return 1.0 if answers_match(answer, self._task.answer) else 0.0

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
        if len(ran) > 1 and not any(call.ok and call.name in self._stateful for call in ran):
            with concurrent.futures.ThreadPoolExecutor(max_workers=len(ran)) as pool:
                results = list(pool.map(lambda call: run_tool_call(call, self._tools_by_name), ran))
        else:  # in order: an env method reads and changes the episode's state, and may end it
            results = []
            for call in ran:
                ended = self._solved is not None
                results.append(
                    ("error", "Error: the episode has ended; this call was not run", False)
                    if ended
                    else run_tool_call(call, self._tools_by_name)
                )
        results += [
            ("error", f"Error: at most {MAX_CALLS_PER_TURN} tool calls per turn; this one was not run", False)
        ] * (len(calls) - len(ran))
        for name, content, ok in results:
            observation.append({"role": "tool", "name": name, "content": content})
            succeeded.append(ok)
        self._tool_calls += len(calls)
        self._tool_errors += succeeded.count(False)
        return observation, succeeded


def reference_step_values(task: Task) -> list[str]:
    """The reference solution's intermediate results, in order ([] if the task lists none)."""
    steps = task.meta.get("steps") or task.meta.get("annotations") or []
    return [str(value) for _expression, value in steps]
