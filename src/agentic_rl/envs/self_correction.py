"""`self_correct`: a wrapper that lets the policy retry after a wrong final answer.

    env = make_env("self_correct", base="arith", base_options={"difficulty": 3}, max_retries=2, decay=0.5)

After a wrong `Final Answer:` the wrapper answers with a user message that does not reveal
the answer ("That answer is not correct. Check your steps and try again.") and reopens the
base episode, up to `max_retries` times. A correct answer on attempt j (0-based: the first
answer is attempt 0) earns `decay ** j` instead of 1.0, so a first-time solution is worth the
most:

    wrong, wrong, correct with decay 0.5  -> terminal reward 0.25, info["attempts"] == 3

Turns without an answer (no `Final Answer:`, or the `max_turns` budget of an attempt spent)
end the episode as in the base env: there is nothing to correct. Tool-call rewards of the
base env pass through unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from agentic_rl.config import Config, Interval, NonNegativeInt
from agentic_rl.envs.base import Env, StepResult, Task, make_env, register_env
from agentic_rl.envs.tool_env import ToolEnv

RETRY_MESSAGE = "That answer is not correct. Check your steps and try again."


@dataclasses.dataclass
class SelfCorrectionOptions(Config):
    """Options of the `self_correct` wrapper."""

    base: str = "arith"
    """Name of the wrapped environment (a tool env such as "arith" or "gsm8k")."""
    base_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Options passed to the wrapped environment (checked by its own options class)."""
    max_retries: NonNegativeInt = 2
    """Extra attempts allowed after the first wrong answer (k); 0 makes the wrapper a no-op."""
    decay: Annotated[float, Interval("(0, 1]")] = 0.5
    """Reward for a correct answer on attempt j (0-based) is decay ** j; in (0, 1]."""

    def __post_init__(self) -> None:
        if self.base == "self_correct":
            raise ValueError("self_correct cannot wrap itself; set base to e.g. 'arith'")


@register_env("self_correct", SelfCorrectionOptions)
class SelfCorrectionEnv(Env):
    """Retries with decaying reward around any `ToolEnv`."""

    name = "self_correct"

    def __init__(self, options: SelfCorrectionOptions | None = None):
        self.options = options or SelfCorrectionOptions()
        base = make_env(self.options.base, **self.options.base_options)
        if not isinstance(base, ToolEnv):
            raise ValueError(
                f"self_correct needs a ToolEnv base (arith, gsm8k, ...); "
                f"'{self.options.base}' is a {type(base).__name__}"
            )
        self.base = base
        self.tools = base.tools
        self.max_turns = base.max_turns * (self.options.max_retries + 1)
        self._attempts = 0

    def tasks(self, split: str, n: int | None = None, seed: int = 0) -> list[Task]:
        return self.base.tasks(split, n, seed)

    def reset(self, task: Task) -> list[dict[str, Any]]:
        self._attempts = 0
        return self.base.reset(task)

    def step(self, action_text: str) -> StepResult:
        result = self.base.step(action_text)
        if not result.done:
            return result
        info = dict(result.info)
        if info["finish"] != "answer":  # no answer to correct
            info["attempts"] = self._attempts
            return StepResult(None, result.reward, True, info)
        self._attempts += 1
        info["attempts"] = self._attempts
        tool_reward = result.reward - info["score"]  # what the tools earned, without the answer's score
        if info["correct"]:
            info["attempt_reward"] = self.options.decay ** (self._attempts - 1)
            return StepResult(None, tool_reward + info["attempt_reward"], True, info)
        if self._attempts > self.options.max_retries:
            return StepResult(None, tool_reward, True, info)
        self.base.resume()
        feedback = [{"role": "user", "content": RETRY_MESSAGE}]
        step_info = {"retry": True, "attempts": self._attempts, "final_answer": info["final_answer"]}
        return StepResult(feedback, tool_reward, False, step_info)

    def oracle_actions(self, task: Task) -> list[str]:
        return self.base.oracle_actions(task)
