"""A chat-completions request as one rollout-engine episode, and its trajectory as the reply.

Model mode (`agentic-rl serve` without --env): `ClientToolsEnv` renders the client's conversation
and tool schemas with the chat format and takes ONE policy turn; tool calls in it go back to the
client, which runs them and sends `tool` messages in its next request.

Agent mode (--env E): `AgentEnv` is chat's `ConversationEnv` (serving/chat.py): the environment's
tools run here, in the same sandbox and limits as training, until a turn without a call (the
reply) or the turn limit. Every turn that called tools is reported as OpenAI messages (an
assistant message with `tool_calls`, then the `tool` results): the response's `tool_trace`, and
in a stream a chunk as soon as the turn's tools have run.

Usage counts token ids of the episode: completion_tokens are the tokens the policy generated
(each turn's stop token included), prompt_tokens all others the model read (the prompt and, in
agent mode, the tool observations), so total_tokens is the episode's length.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from agentic_rl.envs.base import Env, StepResult, Task
from agentic_rl.rollout.engine import EpisodeOptions
from agentic_rl.rollout.sampling import SamplingParams
from agentic_rl.rollout.trajectory import Trajectory
from agentic_rl.serving.chat import ConversationEnv
from agentic_rl.serving.openai_api import APIError, ChatRequest, reply_message, training_messages, turn_trace, usage
from agentic_rl.tools.parse import TOOL_CALL_OPEN, parse_tool_calls

TraceCallback = Callable[[list[dict[str, Any]]], None]

_LENGTH_REASONS = {"max_turns", "max_turn_tokens", "max_episode_tokens"}


class ClientToolsEnv(Env):
    """Model mode: one turn over the client's conversation, with the client's tool schemas; no tool runs here."""

    name = "serve"
    max_turns = 1

    def __init__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> None:
        self.messages, self._schemas = messages, tools

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        return self._schemas

    def reset(self, task: Task) -> list[dict[str, Any]]:
        return [dict(message) for message in self.messages]

    def step(self, action_text: str) -> StepResult:
        return StepResult(None, 0.0, True, {})


class AgentEnv(ConversationEnv):
    """Agent mode: the environment's tools run on each call; every turn that called tools goes to `on_trace`."""

    def __init__(
        self, tool_names: list[str], history: list[dict[str, Any]], max_turns: int, on_trace: TraceCallback
    ) -> None:
        super().__init__(tool_names, history, max_turns)
        self.on_trace = on_trace
        self.trace: list[dict[str, Any]] = []
        self.turns = 0

    def step(self, action_text: str) -> StepResult:
        result = super().step(action_text)
        self.turns += 1
        if parse_tool_calls(action_text):
            messages = turn_trace(self.turns, action_text, result.observation or [])
            self.trace.extend(messages)
            self.on_trace(messages)
        return result


def request_episode(
    request: ChatRequest,
    request_id: str,
    seed: int,
    agent_tools: list[str] | None,
    max_turns: int,
    on_trace: TraceCallback = lambda messages: None,
    cancel: threading.Event | None = None,
) -> tuple[Env, Task, EpisodeOptions]:
    """(env, task, options) of one request. agent_tools: the environment's tools (agent mode), or None.
    cancel: set when the client went away; the engine then ends the episode at its next step."""
    messages = training_messages(request.messages)
    options = EpisodeOptions(
        SamplingParams(request.temperature, request.top_p, request.top_k, seed=seed),
        request.max_tokens,
        request.stop,
        cancel=cancel,
    )
    if agent_tools is None:
        return ClientToolsEnv(messages, request.tools), Task(request_id, "", ""), options
    if messages[-1]["role"] != "user":
        raise APIError(
            400,
            f"agent mode answers a user message: the last message must have role user, got {messages[-1]['role']}",
            f"messages[{len(messages) - 1}].role",
        )
    for index, message in enumerate(messages):
        if message["role"] == "system":
            raise APIError(
                400,
                "agent mode uses its environment's system prompt (the one the agent was trained with); "
                "drop the system message",
                f"messages[{index}].role",
            )
    env = AgentEnv(agent_tools, messages[:-1], max_turns, on_trace)
    return env, Task(request_id, messages[-1]["content"], ""), options


def reply(trajectory: Trajectory, request: ChatRequest, agent_mode: bool) -> tuple[dict[str, Any], str, dict[str, int]]:
    """(assistant message, finish_reason, usage) of a finished episode; APIError when it produced no reply."""
    if trajectory.finish_reason == "error":
        raise APIError(
            500, f"the episode failed: {trajectory.info.get('error')}", kind="server_error", code="episode_error"
        )
    if not trajectory.policy_spans:
        raise APIError(
            400,
            f"the prompt has {len(trajectory)} tokens, which leaves no room to generate within this server's "
            "rollout.max_episode_tokens; shorten the conversation",
            "messages",
            "context_length_exceeded",
        )
    text = trajectory.messages[-1]["content"]
    if agent_mode:
        message: dict[str, Any] = {"role": "assistant", "content": text.split(TOOL_CALL_OPEN, 1)[0].strip()}
        tool_finish = None
    else:
        message, tool_finish = reply_message(text, parse_tools=bool(request.tools), stop=request.stop)
    finish = "length" if trajectory.finish_reason in _LENGTH_REASONS else (tool_finish or "stop")
    completion_tokens = trajectory.num_policy_tokens
    return message, finish, usage(len(trajectory) - completion_tokens, completion_tokens)
