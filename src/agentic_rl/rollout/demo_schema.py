"""The shape of one demonstration line, checked before anything is tokenized.

    check_demo_record(record, where="demos.jsonl:3")    # DemoError naming the line, the message and the fix

A line is {"messages": [...], "tools": ["calculator", ...]} (tools optional). Each message:

    role        keys it may have                  content
    system      role, content                     a string, required
    user        role, content                     a string, required
    assistant   role, content, tool_calls         a string; may be absent or null when tool_calls is given
    tool        role, content, name               a string, required; answers a call of the assistant turn before it

A tool message answers the earlier turn's calls in order: the k-th tool message after an assistant
turn answers its k-th `<tool_call>` (written in its content or given as tool_calls), and a `name`,
when given, must be that call's tool. A tool message with no call left to answer is refused: SFT
would otherwise train the model on a result it never asked for. Nothing unknown is dropped: a key
this table does not list is an error (docs/design.md invariant 6).
"""

from __future__ import annotations

import json
from typing import Any

from agentic_rl.tools.parse import assistant_turn_text, parse_tool_calls

RECORD_KEYS = ("messages", "tools")
MESSAGE_KEYS = {
    "system": ("role", "content"),
    "user": ("role", "content"),
    "assistant": ("role", "content", "tool_calls"),
    "tool": ("role", "content", "name"),
}


MAX_MESSAGES = 512
"""Messages in one line, checked before anything is rendered: each observation is rendered against
the whole history before it (the engine's incremental chat format), so a line costs the square of its
count; 512 short messages take ~4-10 s on the 2-core CPU, the 200k of a hostile line would take hours."""
MAX_LINE_BYTES = 4 << 20
"""Bytes in one line, checked before it is parsed: 4 MiB is more text than any model's context holds."""


class DemoError(ValueError):
    """A demonstration cannot be turned into a trajectory; the message names where and why."""


def check_demo_record(record: Any, where: str) -> None:
    """Raise DemoError (prefixed by `where`, e.g. "demos.jsonl:3") for the first problem of one line."""
    if not isinstance(record, dict) or not isinstance(record.get("messages"), list) or not record["messages"]:
        raise DemoError(
            f'{where}: each line needs a non-empty "messages" list of chat messages, e.g. '
            '{"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]}'
        )
    unknown = sorted(set(record) - set(RECORD_KEYS))
    if unknown:
        raise DemoError(
            f"{where}: unknown key {unknown[0]!r} in the line; a line may only hold {', '.join(RECORD_KEYS)}"
        )
    if len(record["messages"]) > MAX_MESSAGES:
        raise DemoError(
            f"{where}: {len(record['messages'])} messages in one demonstration, more than {MAX_MESSAGES}; "
            "split the conversation into shorter demonstrations"
        )
    tools = record.get("tools", [])
    if not isinstance(tools, list) or not all(isinstance(name, str) for name in tools):
        raise DemoError(f'{where}: "tools" must be a list of registered tool names, e.g. ["calculator"], got {tools!r}')
    unanswered: list[str | None] = []  # the tools of the last assistant turn's calls not yet answered
    for index, message in enumerate(record["messages"]):
        at = f"{where}: messages[{index}]"
        role = _check_message(message, at)
        if role == "assistant":
            unanswered = [call.name for call in parse_tool_calls(_turn_text(message, at))]
        elif role == "tool":
            if not unanswered:
                raise DemoError(
                    f"{at} is a tool result that answers no call: the assistant turn before it has no "
                    "<tool_call> left unanswered. Add the call to that assistant message (content or "
                    'tool_calls), or make this a "user" message'
                )
            called = unanswered.pop(0)
            if "name" in message and called is not None and message["name"] != called:
                raise DemoError(
                    f"{at} has name {message['name']!r}, but the call it answers is to {called!r}; "
                    "tool results answer the calls in order: fix the name or the order"
                )
        else:
            unanswered = []


def _check_message(message: Any, at: str) -> str:
    if not isinstance(message, dict) or message.get("role") not in MESSAGE_KEYS:
        role = message.get("role") if isinstance(message, dict) else None
        raise DemoError(f"{at} needs a role of {', '.join(MESSAGE_KEYS)}, got {role!r}")
    role = message["role"]
    unknown = sorted(set(message) - set(MESSAGE_KEYS[role]))
    if unknown:
        raise DemoError(
            f"{at}: unknown key {unknown[0]!r} in a {role} message; it may only hold {', '.join(MESSAGE_KEYS[role])}"
        )
    optional = role == "assistant" and bool(message.get("tool_calls"))
    if "content" not in message or (message["content"] is None and optional):
        if not optional:
            raise DemoError(
                f'{at}: a {role} message needs "content", a string'
                + (' (or "tool_calls" for an assistant turn that only calls tools)' if role == "assistant" else "")
            )
    elif not isinstance(message["content"], str):
        raise DemoError(
            f'{at}: "content" must be a string, got {type(message["content"]).__name__} {_short(message["content"])}; '
            "write the text as one JSON string"
        )
    if "name" in message and not isinstance(message["name"], str):
        raise DemoError(f'{at}: "name" must be the tool\'s name as a string, got {_short(message["name"])}')
    return role


def _turn_text(message: dict[str, Any], at: str) -> str:
    """The assistant turn as the policy writes it, after checking each of its tool_calls."""
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise DemoError(
            f'{at}: "tool_calls" must be a list of {{"name": ..., "arguments": {{...}}}}, got {_short(calls)}'
        )
    for number, call in enumerate(calls):
        _check_call(call, f"{at}: tool_calls[{number}]")
    return assistant_turn_text(message)


def _check_call(call: Any, at: str) -> None:
    """A call is {"name", "arguments": {...}} (demonstrations) or OpenAI's {"id", "type", "function":
    {"name", "arguments": "<JSON object text>"}} (a served conversation)."""
    shape = 'must be {"name": "<tool>", "arguments": {...}}'
    openai_form = isinstance(call, dict) and "function" in call
    function = call.get("function") if openai_form else call
    outer_keys = ("id", "type", "function") if openai_form else ("name", "arguments")
    if (
        not isinstance(call, dict)
        or not isinstance(function, dict)
        or set(call) - set(outer_keys)
        or set(function) - {"name", "arguments"}
    ):
        raise DemoError(f'{at} {shape} (or OpenAI\'s {{"function": {{"name", "arguments"}}}}), got {_short(call)}')
    if not isinstance(function.get("name"), str) or not function["name"]:
        raise DemoError(f"{at} {shape}: the tool's name is missing, got {_short(call)}")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str) and openai_form:
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            arguments = None
    if not isinstance(arguments, dict):
        raise DemoError(f"{at} {shape}: the arguments must be a JSON object, got {_short(function.get('arguments'))}")


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 80 else text[:77] + "..."
