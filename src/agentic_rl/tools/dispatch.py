"""One parsed tool call run against an episode's tools, the one way every env does it (ToolEnv,
plan, memory): an observation's (name, content, succeeded), never an exception from the call.

    name, content, ok = run_tool_call(call, {tool.name: tool for tool in env.tools})

A malformed call, an unknown tool, a ToolError or any other exception of the tool becomes an
error observation the episode survives (hostile model output never crashes a run); only
ToolUnavailable (the host cannot run the tool at all) stops the run. A result longer than
MAX_OBSERVATION_CHARS is cut, with a note, to bound the context.
"""

from __future__ import annotations

from agentic_rl.tools.base import Tool, ToolError, ToolUnavailable
from agentic_rl.tools.parse import ToolCall

MAX_OBSERVATION_CHARS = 2000
"""A longer tool result is cut to this many characters (with a note) to bound the context."""


def run_tool_call(call: ToolCall, tools: dict[str, Tool]) -> tuple[str, str, bool]:
    """(observation name, content, succeeded) for one parsed call; `tools` by name, in the order an
    unknown-tool error lists them."""
    if not call.ok:
        return "error", f"Error: {call.error}", False
    tool = tools.get(call.name or "")
    if tool is None:
        return "error", f"Error: unknown tool {call.name!r}; available tools: {', '.join(tools)}", False
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
