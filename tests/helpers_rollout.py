"""Shared fakes of the rollout tests: a calculator tool loop env (`ToolLoopEnv`), an env that shows
only its last turns (`WindowEnv`, a history that is not a prefix), and `ScriptedRunner`, a fake
model that writes fixed token scripts, put behind a real engine by `scripted_engine`."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from agentic_rl.envs.base import Env, StepResult, Task
from agentic_rl.rollout.backend import RunnerBackend
from agentic_rl.rollout.config import RolloutConfig
from agentic_rl.rollout.engine import RolloutEngine
from agentic_rl.rollout.runner import Runner
from agentic_rl.rollout.sampling import SamplingParams
from agentic_rl.tools.parse import format_tool_call


CALCULATOR_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}


class ToolLoopEnv(Env):
    """Answers every turn with a tool observation until turn `tool_turns`, then ends (final_answer set).

    With `fail_on_turn`, env.step raises on that turn; with `feedback`, observations are user turns.
    """

    name = "fake-tools"
    max_turns = 16

    def __init__(
        self,
        tool_turns: int = 2,
        fail_on_turn: int | None = None,
        feedback: bool = False,
        question: str = "What is 6*7?",
    ):
        self.tool_turns, self.fail_on_turn, self.feedback, self.question = tool_turns, fail_on_turn, feedback, question
        self.turn = 0
        self.actions: list[str] = []

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        return [CALCULATOR_SCHEMA]

    def reset(self, task: Task) -> list[dict[str, Any]]:
        self.turn, self.actions = 0, []
        return [
            {"role": "system", "content": "You solve problems with tools."},
            {"role": "user", "content": task.question},
        ]

    def step(self, action_text: str) -> StepResult:
        self.turn += 1
        self.actions.append(action_text)
        if self.turn == self.fail_on_turn:
            raise RuntimeError("calculator crashed")
        if self.turn > self.tool_turns:
            return StepResult(None, 1.0, True, {"final_answer": "42", "correct": True})
        if self.feedback:
            observation = [{"role": "user", "content": f"Try again ({self.turn})."}]
        else:
            observation = [{"role": "tool", "name": "calculator", "content": f"{self.turn * 7}"}]
        return StepResult(observation, 0.1 * self.turn, False, {"tool_calls": 1})


class WindowEnv(Env):
    """A tool loop that shows only the last `window` turns: [system, user] + the last `window`
    (assistant, tool) exchanges. Ends after `tool_turns` tool observations. Records each context."""

    name = "fake-window"
    max_turns = 16

    def __init__(self, tool_turns: int = 3, window: int = 1, question: str = "What is 6*7?", note: str = ""):
        self.tool_turns, self.window, self.question, self.note = tool_turns, window, question, note
        self.contexts: list[list[dict[str, Any]]] = []

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        return [CALCULATOR_SCHEMA]

    def reset(self, task: Task) -> list[dict[str, Any]]:
        self.turn, self.exchanges, self.contexts = 0, [], []
        self.head = [
            {"role": "system", "content": "You solve problems with tools."},
            {"role": "user", "content": task.question},
        ]
        return list(self.head)

    def step(self, action_text: str) -> StepResult:
        self.turn += 1
        if self.turn > self.tool_turns:
            return StepResult(None, 1.0, True, {"final_answer": "42", "correct": True})
        observation = [{"role": "tool", "name": "calculator", "content": f"{self.turn * 7}"}]
        self.exchanges.append([{"role": "assistant", "content": action_text}, *observation])
        context = None
        if len(self.exchanges) > self.window:
            head = self.head[:1] + [{"role": "user", "content": self.head[1]["content"] + self.note}]
            context = head + [m for exchange in self.exchanges[len(self.exchanges) - self.window :] for m in exchange]
            self.contexts.append(context)
        return StepResult(observation, self.turn / 8, False, {"tool_calls": 1}, context=context)


class ScriptedRunner(Runner):
    """A fake model: slot k (in alloc order) emits `scripts[k]` token by token (one token per forward).

    It records every chunk it is fed, so tests can check what the KV cache would hold.
    """

    def __init__(self, scripts: Sequence[Sequence[int]], vocab_size: int, max_slots: int = 16, max_len: int = 4096):
        self.scripts, self.vocab_size, self.max_slots, self.max_len = (
            [list(s) for s in scripts],
            vocab_size,
            max_slots,
            max_len,
        )
        self.fed: dict[int, list[int]] = {}
        self.script_of: dict[int, int] = {}
        self.emitted: dict[int, int] = {}
        self.allocations = 0

    def alloc(self) -> int:
        slot = self.allocations
        self.allocations += 1
        self.fed[slot], self.script_of[slot], self.emitted[slot] = [], slot, 0
        return slot

    def free(self, slot: int) -> None:
        self.emitted.pop(slot)

    def length(self, slot: int) -> int:
        return len(self.fed[slot])

    def sync_weights(self) -> None:
        pass

    def forward(self, slots, chunks):
        logits = torch.full((len(slots), self.vocab_size), -1e4)
        for row, (slot, chunk) in enumerate(zip(slots, chunks)):
            assert chunk, "empty chunk"
            self.fed[slot].extend(chunk)
            script = self.scripts[self.script_of[slot]]
            logits[row, script[min(self.emitted[slot], len(script) - 1)]] = 0.0
            self.emitted[slot] += 1
        return logits


def task(i: int = 0, question: str = "What is 6*7?") -> Task:
    return Task(id=f"t{i}", question=question, answer="42")


def tool_turn(expression: str) -> str:
    return format_tool_call("calculator", {"expression": expression})


def scripted_engine(tokenizer, chat_format, turn_texts_per_episode, limits=None, temperature=0.0):
    """An engine whose 'model' writes the given turns (canonical tokenization; <|im_end|> turns end with it)."""
    scripts = [
        sum((tokenizer(t, add_special_tokens=False)["input_ids"] for t in turns), [])
        for turns in turn_texts_per_episode
    ]
    runner = ScriptedRunner(scripts, len(tokenizer))
    limits = limits or RolloutConfig(max_turn_tokens=128, max_episode_tokens=2048, max_turns=8)
    return RolloutEngine(
        RunnerBackend(runner, chat_format), chat_format, tokenizer, limits, SamplingParams(temperature=temperature)
    ), runner
