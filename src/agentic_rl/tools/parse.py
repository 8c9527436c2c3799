"""Parse Qwen3/Hermes tool calls out of a model turn.

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "48/2"}}
    </tool_call>

Parsing never raises: a malformed block becomes a `ToolCall` with `error` set, so the
environment can answer with an error observation the model can learn from.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_BLOCK = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One parsed `<tool_call>` block. Exactly one of (name, error) is meaningful."""

    name: str | None
    arguments: dict[str, Any]
    raw: str
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every `<tool_call>` block in `text`, in order, valid or not.

    An unterminated final block (the turn was cut at the token limit) is reported as an error.
    """
    calls = []
    for match in _BLOCK.finditer(text):
        body, close = match.group(1), match.group(2)
        raw = match.group(0)
        if not close:
            calls.append(ToolCall(None, {}, raw, "unterminated <tool_call> block (missing </tool_call>)"))
            continue
        calls.append(_parse_body(body.strip(), raw))
    return calls


def _parse_body(body: str, raw: str) -> ToolCall:
    try:
        payload = json.loads(body)
    except json.JSONDecodeError as exc:
        return ToolCall(None, {}, raw, f"tool call is not valid JSON ({exc.msg} at char {exc.pos})")
    except (ValueError, RecursionError) as exc:  # an integer over 4300 digits; nesting too deep
        return ToolCall(None, {}, raw, f"tool call is not usable JSON ({_short_reason(exc)})")
    if not isinstance(payload, dict):
        return ToolCall(None, {}, raw, 'tool call must be a JSON object {"name": ..., "arguments": {...}}')
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall(None, {}, raw, 'tool call needs a string "name"')
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):  # some models emit arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return ToolCall(name, {}, raw, '"arguments" must be a JSON object')
    if not isinstance(arguments, dict):
        return ToolCall(name, {}, raw, '"arguments" must be a JSON object')
    extra = sorted(set(payload) - {"name", "arguments"})
    if extra:
        return ToolCall(name, arguments, raw, f"unexpected key(s) {extra} in tool call; use only name and arguments")
    return ToolCall(name, arguments, raw)


def _short_reason(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return str(exc).split(";")[0][:120] or type(exc).__name__


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The canonical text of one call, as demonstrations and oracles write it. A closing marker inside
    a string is written `<\\/tool_call>` (JSON's escaped solidus, the same string once parsed), so the
    block ends where the call does and `parse_tool_calls` gives the arguments back exactly."""
    body = json.dumps({"name": name, "arguments": arguments}).replace(TOOL_CALL_CLOSE, "<\\/tool_call>")
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def assistant_turn_text(message: dict[str, Any]) -> str:
    """An assistant message as the policy writes its turn: the content, then each of its
    `tool_calls` in the canonical form (one per line). A call is {"name", "arguments": {...}}
    (demonstrations) or OpenAI's {"function": {"name", "arguments": "<JSON object text>"}}
    (a served conversation); invalid JSON arguments raise ValueError."""
    text = message.get("content") or ""
    for call in message.get("tool_calls") or []:
        function = call.get("function", call)
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            arguments = json.loads(arguments) if arguments.strip() else {}
        text = (text + "\n" if text else "") + format_tool_call(function["name"], arguments)
    return text
