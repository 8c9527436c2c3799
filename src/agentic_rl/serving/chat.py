"""`agentic-rl chat`: a terminal conversation with a trained agent, its tool calls shown as they run.

    agentic-rl chat --model runs/demo/grpo/final [--env arith]

Each user message is one episode of the rollout engine, the same multi-turn loop as training and
evaluation: the chat format renders the conversation, the agent's turns are decoded token in,
token out, and its tool calls run in the environment's tools (inside the same sandbox and limits
as training). The conversation so far is the next episode's prompt. `ConversationEnv` is that
environment: the tools and system prompt of `--env`, no grading (a chat has no reference answer).

    you> What is 48/2 + 3?
    agent> Step 1: halve 48.
      -> calculator {"expression": "48/2"}
      <- 24
    agent> Step 2: 24 + 3 = 27
    Final Answer: 27
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable

from agentic_rl.config import NonNegativeFloat, refuse_unused, require_model
from agentic_rl.envs.base import EnvSpec, StepResult, Task
from agentic_rl.envs.tool_env import ToolEnv
from agentic_rl.plugins import PluginsConfig
from agentic_rl.rollout.config import RolloutConfig, Sampling
from agentic_rl.tools.parse import TOOL_CALL_OPEN, parse_tool_calls


@dataclasses.dataclass(frozen=True)
class ChatSampling(Sampling):
    """`agentic-rl chat`'s sampling: greedy by default."""

    temperature: NonNegativeFloat = 0.0


@dataclasses.dataclass
class ChatRolloutConfig(RolloutConfig):
    """`agentic-rl chat`'s rollout: RolloutConfig decoding greedily by default."""

    sampling: ChatSampling = dataclasses.field(default_factory=ChatSampling)


@dataclasses.dataclass
class ChatConfig(PluginsConfig):
    """`agentic-rl chat`: which agent, which tools, how replies are decoded."""

    model: str = ""
    """Built-in name, HF directory, hub id, or a stage's final/ folder."""
    env: EnvSpec = dataclasses.field(default_factory=EnvSpec)
    """The environment whose tools (and system prompt) the agent gets, e.g. {name: gsm8k, options: {tools: [python]}}."""
    rollout: ChatRolloutConfig = dataclasses.field(default_factory=ChatRolloutConfig)
    """How replies are decoded (greedy by default); rollout.max_turns bounds the turns of one reply."""
    seed: int = 0
    """Sampling seed (when rollout.sampling.temperature > 0)."""

    def __post_init__(self) -> None:
        require_model(self.model)
        if self.rollout.sampling.temperature == 0:  # greedy replies: nothing is sampled
            why = dict(used_with="rollout.sampling.temperature > 0", now="temperature is 0: greedy replies")
            refuse_unused(self.rollout.sampling, ["top_p", "top_k"], prefix="rollout.sampling.", **why)
            refuse_unused(self, ["seed"], prefix="", **why)


Event = tuple[str, str]
"""(kind, text): ("assistant", its words), ("call", "name {json args}"), ("result", tool output)."""


class ConversationEnv(ToolEnv):
    """One reply of a chat: the history plus the user's new message in, tool calls run until a turn
    without a call (the reply) or the turn limit; `on_event` sees every turn as it happens."""

    name = "chat"

    def __init__(
        self,
        tool_names: list[str],
        history: list[dict[str, Any]],
        max_turns: int,
        on_event: Callable[[Event], None] = lambda event: None,
    ):
        super().__init__(tool_names, max_turns)
        self.history = history
        self.on_event = on_event

    def reset(self, task: Task) -> list[dict[str, Any]]:
        system, user = super().reset(task)
        return [system, *self.history, user]

    def step(self, action_text: str) -> StepResult:
        words = action_text.split(TOOL_CALL_OPEN, 1)[0].strip()
        if words:
            self.on_event(("assistant", words))
        for call in parse_tool_calls(action_text):
            self.on_event(
                ("call", f"{call.name} {json.dumps(call.arguments)}" if call.ok else f"(malformed: {call.error})")
            )
        result = super().step(action_text)
        for message in result.observation or []:
            self.on_event(("result", message["content"]))
        return result


def chat_loop(
    model: Any,
    tokenizer: Any,
    tool_names: list[str],
    rollout: Any,
    read: Callable[[], str | None],
    show: Callable[[Event], None],
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Converse until `read` returns None (end of input) or "exit"; returns the conversation (no system message).

    rollout: the RolloutConfig episodes decode with (temperature 0 for greedy replies).
    """
    from agentic_rl.rollout.factory import build_engine  # local: torch-free

    engine = build_engine(model, tokenizer, rollout, seed=seed, max_concurrent=1)
    history: list[dict[str, Any]] = []
    while (text := read()) is not None and text.strip() != "exit":
        if not text.strip():
            continue
        env = ConversationEnv(tool_names, history, rollout.max_turns, show)
        (episode,) = engine.run([env], [Task(id=f"chat/{len(history)}", question=text, answer="")])
        if episode.finish_reason not in ("answered", "env_done"):
            show(("assistant", f"[the reply stopped: {episode.finish_reason}]"))
        history = [message for message in episode.messages if message["role"] != "system"]
    return history
