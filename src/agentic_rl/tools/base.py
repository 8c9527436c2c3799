"""Tools: typed Python functions the agent calls with Qwen3/Hermes `<tool_call>` blocks.

A tool is a plain function with type hints and a Google-style docstring. Its JSON schema,
the form transformers' chat templates take (`tools=[...]`), is derived from the function by
`transformers.utils.get_json_schema`, so the schema the model sees is the one the code checks.

A tool returns a string (the observation text) or raises `ToolError` with a message the model
can learn from. Any other exception is a bug in the tool, and the caller still turns it into
an error observation: hostile model output never crashes an episode. The one exception is
`ToolUnavailable`: the host cannot run the tool, and the run stops.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable

from transformers.utils import get_json_schema

from agentic_rl.plugins import load_entry_points
from agentic_rl.registry import Registry


class ToolError(Exception):
    """A tool call failed in a way the model should be told about (bad input, limit hit, the
    code it ran raised). The call counts as a tool error in `tool_errors` and the rewards."""


class ToolUnavailable(RuntimeError):
    """The host cannot run this tool at all (e.g. the python sandbox cannot be built). Not the
    model's fault and not an observation: environments and the rollout engine let it through,
    so the run stops instead of training on a dead tool."""


@dataclasses.dataclass(frozen=True)
class Tool:
    """One callable tool and its chat-template schema."""

    name: str
    fn: Callable[..., str]
    schema: dict[str, Any]

    @classmethod
    def from_function(cls, fn: Callable[..., str], name: str | None = None) -> "Tool":
        schema = get_json_schema(fn)
        schema["function"].pop("return", None)
        if name is not None:
            schema["function"]["name"] = name
        return cls(name=schema["function"]["name"], fn=fn, schema=schema)

    def call(self, arguments: dict[str, Any]) -> str:
        """Validate `arguments` against the signature, then run the tool.

        Raises ToolError for unknown, missing or wrongly typed arguments.
        """
        params = self.schema["function"]["parameters"]
        properties = params.get("properties", {})
        unknown = sorted(set(arguments) - set(properties))
        if unknown:
            raise ToolError(f"unknown argument(s) {unknown} for tool '{self.name}'; allowed: {sorted(properties)}")
        missing = [k for k in params.get("required", []) if k not in arguments]
        if missing:
            raise ToolError(f"missing required argument(s) {missing} for tool '{self.name}'")
        for key, value in arguments.items():
            expected = properties[key].get("type")
            if not _json_type_matches(expected, value):
                raise ToolError(
                    f"argument '{key}' of tool '{self.name}' must be {expected}, got {type(value).__name__}"
                )
        result = self.fn(**arguments)
        if not isinstance(result, str):
            result = str(result)
        return result


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


def _json_type_matches(expected: str | None, value: Any) -> bool:
    if expected is None or expected not in _JSON_TYPES:
        return True
    if expected in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, _JSON_TYPES[expected])


_TOOLS: Registry[Callable[[], Tool]] = Registry("tool", "tools", lambda: _ensure_builtin_tools())
"""name -> a factory of a fresh Tool."""


def register_tool(name: str) -> Callable:
    """Decorator: register a typed function (or a zero-arg factory returning a Tool) by name.

    Example::

        @register_tool("word_count")
        def word_count(text: str) -> str:
            '''Count the words in a text.

            Args:
                text: The text to count.
            '''
            return str(len(text.split()))
    """

    def decorator(fn: Callable) -> Callable:
        if inspect.isfunction(fn) and fn.__annotations__.get("return") in ("Tool", Tool):
            _TOOLS.add(name, fn, fn)
        else:
            _TOOLS.add(name, lambda: Tool.from_function(fn, name=name), fn)
        return fn

    return decorator


def get_tool(name: str) -> Tool:
    """The registered tool `name`, freshly built; raises ValueError listing the registered tools otherwise."""
    return _TOOLS.get(name)()


def list_tools() -> list[str]:
    return _TOOLS.names()


def _ensure_builtin_tools() -> None:
    """The built-in tools, then those of installed plugin packages (entry points; agentic_rl.plugins)."""
    # Importing the modules runs their @register_tool decorators.
    from agentic_rl.tools import calculator, python_sandbox  # noqa: F401  # local: cycle

    load_entry_points("agentic_rl.tools")
