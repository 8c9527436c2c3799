"""The OpenAI chat-completions wire format: request checks, message conversion, response shapes.

Pure functions over JSON values (no model, no HTTP), so each rule is tested alone:

    request = parse_chat_request(body, model_id="tiny-qwen3", limits=cfg.rollout, agent_mode=False)
    messages = training_messages(request.messages)                      # what the chat format renders
    message, finish = reply_message(text, parse_tools=True, stop=("\n\n",))  # the assistant message clients read

Every setting is used or rejected (docs/design.md invariant 6): an unknown request field is a 400 that
names it; a few fields OpenAI clients send are accepted only at their neutral value
(`frequency_penalty: 0`, `logprobs: false`, ...). Errors are `APIError`s, which the server turns
into OpenAI's shape `{"error": {"message", "type", "param", "code"}}`.

Conversion to the training chat format (one code path with SFT and rollouts):
  * an assistant message's `tool_calls` become `<tool_call>` blocks after its content, the text the
    policy writes (tools/parse.py `assistant_turn_text`, as demonstrations are written);
  * a `tool` message becomes {"role": "tool", "name": <the function its tool_call_id named>,
    "content"}, which ChatFormat renders as training does (Qwen3: <tool_response> in a user turn);
    its tool_call_id must name a call of an earlier assistant message (else a 400);
  * every content the client sends is data: ChatFormat encodes control strings in it (`<|im_end|>`,
    `<|im_start|>assistant`) as plain text, so a client cannot forge turns (models/data_tokens.py);
  * content given as a list of parts is joined from its text parts (other parts are rejected).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import uuid
from typing import Any

from agentic_rl.tools.parse import TOOL_CALL_OPEN, assistant_turn_text, parse_tool_calls

MAX_STOP_STRINGS = 4
"""OpenAI's limit on `stop`."""

_NEUTRAL = {"frequency_penalty": 0, "presence_penalty": 0, "logprobs": False, "n": 1}
"""Fields accepted only at these values: the engine has no penalties, log-prob output or n > 1."""
_METADATA = {"user", "parallel_tool_calls", "stream_options"}
"""Fields accepted as they are (a user id; every call of a turn is always parsed; stream options)."""


def shown(value: Any, limit: int = 200) -> str:
    """`repr(value)` for an error message, cut to `limit` characters: a client's 4 MB value is not echoed back."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


class APIError(Exception):
    """A request the server answers with an OpenAI-shaped error."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclasses.dataclass
class ChatRequest:
    """A checked chat-completions request, with the server's defaults filled in."""

    messages: list[dict[str, Any]]
    """The client's messages, checked (OpenAI shape)."""
    tools: list[dict[str, Any]]
    """Function schemas for the chat template ([] when none, or tool_choice "none")."""
    temperature: float
    top_p: float
    top_k: int
    """Top-k sampling (0: off); not in OpenAI's API, an extension as in vLLM (default: the server's rollout.sampling.top_k)."""
    max_tokens: int
    """Token limit of each generated turn (model mode: of the reply)."""
    stop: tuple[str, ...]
    seed: int | None
    stream: bool
    include_usage: bool
    """stream_options.include_usage: a last chunk carries the usage."""


def parse_chat_request(body: Any, model_id: str, limits: Any, agent_mode: bool) -> ChatRequest:
    """Check a request body against the API and this server; raise APIError naming the field.

    limits: the server's RolloutConfig (its sampling: the defaults of temperature, top_p, top_k; max_tokens; the episode limit).
    """
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    known = {
        "model",
        "messages",
        "tools",
        "tool_choice",
        "temperature",
        "top_p",
        "top_k",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "seed",
        "stream",
        *_NEUTRAL,
        *_METADATA,
    }
    unknown = sorted(set(body) - known)
    if unknown:
        raise APIError(
            400, f"unsupported field '{unknown[0]}'; this server accepts: {', '.join(sorted(known))}", unknown[0]
        )
    for name, neutral in _NEUTRAL.items():
        if name in body and body[name] is not None and body[name] != neutral:
            raise APIError(
                400,
                f"'{name}' must be {json.dumps(neutral)} here (the engine does not support it), got {shown(body[name])}",
                name,
            )
    if body.get("model") != model_id:
        if not isinstance(body.get("model"), str) or not body.get("model"):
            raise APIError(400, "'model' is required: the id /v1/models lists", "model")
        raise APIError(
            404,
            f"the model '{body['model']}' does not exist; this server serves '{model_id}'",
            "model",
            "model_not_found",
        )
    messages = _check_messages(body.get("messages"))
    tools = _check_tools(body.get("tools"), body.get("tool_choice"), agent_mode)
    temperature = _number(body, "temperature", limits.sampling.temperature, 0.0, 2.0)
    top_p = _number(body, "top_p", limits.sampling.top_p, 0.0, 1.0)
    if top_p == 0.0:
        raise APIError(400, "'top_p' must be > 0 (1 disables nucleus sampling)", "top_p")
    top_k = body.get("top_k", limits.sampling.top_k)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise APIError(400, f"'top_k' must be a non-negative integer (0: off), got {shown(top_k)}", "top_k")
    max_tokens = _max_tokens(body, limits)
    stop = _check_stop(body.get("stop"), agent_mode)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise APIError(400, f"'seed' must be a non-negative integer, got {shown(seed)}", "seed")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise APIError(400, f"'stream' must be true or false, got {shown(stream)}", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise APIError(400, "'stream_options' may only hold include_usage", "stream_options")
    return ChatRequest(
        messages, tools, temperature, top_p, top_k, max_tokens, stop, seed, stream, bool(options.get("include_usage"))
    )


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return float(default)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        raise APIError(400, f"'{name}' must be a number in [{low:g}, {high:g}], got {shown(value)}", name)
    return float(value)


def _max_tokens(body: dict[str, Any], limits: Any) -> int:
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    value = body.get(name)
    if value is None:
        return int(limits.max_turn_tokens)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limits.max_episode_tokens:
        raise APIError(
            400,
            f"'{name}' must be an integer in [1, {limits.max_episode_tokens}] (this server's "
            f"rollout.max_episode_tokens), got {shown(value)}",
            name,
        )
    return value


def _check_stop(stop: Any, agent_mode: bool) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOP_STRINGS:
        raise APIError(
            400,
            f"'stop' must be a non-empty string or a list of at most {MAX_STOP_STRINGS} of them, got {shown(stop)}",
            "stop",
        )
    if agent_mode and stops:
        raise APIError(
            400,
            "'stop' is not supported in agent mode: the environment decides when a turn's text "
            "is a tool call or the answer; start the server without --env to use stop",
            "stop",
        )
    return tuple(stops)


def _check_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "'messages' is required: a non-empty list of {role, content} objects", "messages")
    checked = []
    call_ids: set[str] = set()  # the ids of the tool calls so far: a tool message must answer one of them
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise APIError(400, f"'{where}' must be an object with role and content", where)
        role = message.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise APIError(
                400, f"'{where}.role' must be system, user, assistant or tool, got {shown(role)}", f"{where}.role"
            )
        out = {
            "role": "system" if role == "developer" else role,
            "content": _text(message.get("content"), f"{where}.content", optional=role == "assistant"),
        }
        if role == "assistant" and message.get("tool_calls"):
            out["tool_calls"] = _check_tool_calls(message["tool_calls"], f"{where}.tool_calls")
            call_ids.update(str(call.get("id")) for call in out["tool_calls"] if call.get("id") is not None)
        if role == "tool":
            if not isinstance(message.get("tool_call_id"), str):
                raise APIError(
                    400,
                    f"'{where}.tool_call_id' is required: the id of the call this result answers",
                    f"{where}.tool_call_id",
                )
            if message["tool_call_id"] not in call_ids:
                known = ", ".join(sorted(call_ids)) or "none"
                raise APIError(
                    400,
                    f"'{where}.tool_call_id' is {message['tool_call_id']!r}, which no earlier assistant message's "
                    f"tool_calls has (their ids: {known}); a tool message answers a call the model made: send the "
                    "assistant message with that call before it",
                    f"{where}.tool_call_id",
                )
            out["tool_call_id"] = message["tool_call_id"]
        if isinstance(message.get("name"), str):
            out["name"] = message["name"]
        checked.append(out)
    return checked


def _text(content: Any, where: str, optional: bool = False) -> str:
    if content is None and optional:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for index, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise APIError(
                    400,
                    f"'{where}[{index}]' must be a text part {{type: text, text: ...}} (this model reads text only)",
                    f"{where}[{index}]",
                )
            parts.append(part["text"])
        return "".join(parts)
    raise APIError(400, f"'{where}' must be a string or a list of text parts, got {shown(content)}", where)


def _check_tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise APIError(400, f"'{where}' must be a list", where)
    for index, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise APIError(400, f"'{where}[{index}].function.name' is required", f"{where}[{index}].function")
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except (TypeError, ValueError):
            arguments = None
        except RecursionError:  # CPython's parser stops near 1,000 levels (serve checks http.max_json_depth after this)
            raise APIError(
                400,
                f"'{where}[{index}].function.arguments' nests arrays and objects about a thousand levels deep; "
                "this server accepts at most http.max_json_depth",
                f"{where}[{index}].function.arguments",
                "json_too_deep",
            ) from None
        if not isinstance(arguments, dict):
            raise APIError(
                400,
                f"'{where}[{index}].function.arguments' must be a JSON object as text, got "
                f"{shown(function.get('arguments'))}",
                f"{where}[{index}].function.arguments",
            )
    return calls


def _check_tools(tools: Any, tool_choice: Any, agent_mode: bool) -> list[dict[str, Any]]:
    if tool_choice not in (None, "auto", "none"):
        raise APIError(
            400,
            f"'tool_choice' must be auto or none here (the model decides whether to call), got {shown(tool_choice)}",
            "tool_choice",
        )
    if not tools:
        return []
    if agent_mode:
        raise APIError(
            400,
            "'tools' are not accepted in agent mode: the server runs its environment's own tools; "
            "omit them, or start the server without --env to run tools yourself",
            "tools",
        )
    if not isinstance(tools, list):
        raise APIError(
            400, "'tools' must be a list of {type: function, function: {name, description, parameters}}", "tools"
        )
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type") != "function"
            or not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
        ):
            raise APIError(
                400,
                f"'tools[{index}]' must be {{type: function, function: {{name, description, parameters}}}}",
                f"tools[{index}]",
            )
    return [] if tool_choice == "none" else tools


# ---------------------------------------------------------------------- to the chat format


def training_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Checked OpenAI messages as the training chat format holds them (see the module docstring)."""
    names: dict[str, str] = {}
    out = []
    for message in messages:
        role = message["role"]
        if role == "assistant":
            for call in message.get("tool_calls") or []:
                names[str(call.get("id"))] = call["function"]["name"]
            out.append({"role": "assistant", "content": assistant_turn_text(message)})
        elif role == "tool":
            out.append(
                {
                    "role": "tool",
                    "name": names.get(message["tool_call_id"], message.get("name", "")),
                    "content": message["content"],
                }
            )
        else:
            out.append({"role": role, "content": message["content"]})
    return out


# ---------------------------------------------------------------------- replies


def reply_message(text: str, parse_tools: bool, stop: tuple[str, ...] = ()) -> tuple[dict[str, Any], str | None]:
    """The assistant message of a model turn's text, and "tool_calls" when it carries calls.

    With `parse_tools`, well-formed `<tool_call>` blocks become OpenAI `tool_calls` (arguments as
    JSON text) and the words before them the content; a malformed block leaves the whole text as
    content (the client sees what the model wrote). The text is cut at the first `stop` string.
    """
    cuts = [text.find(s) for s in stop if s in text]
    if cuts:
        text = text[: min(cuts)]
    calls = parse_tool_calls(text) if parse_tools else []
    if calls and all(call.ok for call in calls):
        words = text.split(TOOL_CALL_OPEN, 1)[0].strip()
        tool_calls = [_tool_call(f"call_{uuid.uuid4().hex[:24]}", call.name, call.arguments) for call in calls]
        return {"role": "assistant", "content": words or None, "tool_calls": tool_calls}, "tool_calls"
    return {"role": "assistant", "content": text}, None


def turn_trace(turn: int, text: str, observation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One agent-mode turn that called tools, as OpenAI messages: the assistant message with its
    `tool_calls` (ids `call_<turn>_<k>`), then one `tool` message per result, in order."""
    calls = parse_tool_calls(text)
    ids = [f"call_{turn}_{k}" for k in range(len(calls))]
    tool_calls = [
        _tool_call(i, c.name, c.arguments)
        if c.ok
        # a malformed call: its raw text, as the model wrote it
        else {"id": i, "type": "function", "function": {"name": c.name or "", "arguments": c.raw}}
        for i, c in zip(ids, calls)
    ]
    assistant = {
        "role": "assistant",
        "content": text.split(TOOL_CALL_OPEN, 1)[0].strip() or None,
        "tool_calls": tool_calls,
    }
    # ToolEnv answers every call with one message, in order (an error message for a malformed or unknown one).
    results = [
        {"role": "tool", "tool_call_id": i, "name": m.get("name", ""), "content": m["content"]}
        for i, m in zip(ids, observation)
    ]
    return [assistant, *results]


def _tool_call(call_id: str, name: str | None, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion(
    request_id: str,
    model_id: str,
    message: dict[str, Any],
    finish_reason: str,
    token_usage: dict[str, int],
    **extra: Any,
) -> dict[str, Any]:
    """A `chat.completion` object; `extra` adds top-level fields (agent mode: tool_trace, episode)."""
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_id,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
        "usage": token_usage,
        **extra,
    }


def chunk(
    request_id: str,
    model_id: str,
    delta: dict[str, Any] | None,
    finish_reason: str | None = None,
    token_usage: dict[str, int] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A `chat.completion.chunk`; delta None gives the usage-only last chunk (no choices)."""
    body: dict[str, Any] = {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model_id,
        "choices": []
        if delta is None
        else [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
    }
    if token_usage is not None:
        body["usage"] = token_usage
    return {**body, **extra}


def stream_deltas(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The deltas of a finished reply message: its content, then each tool call (with its index)."""
    deltas = []
    if message.get("content"):
        deltas.append({"content": message["content"]})
    for index, call in enumerate(message.get("tool_calls") or []):
        deltas.append({"tool_calls": [{"index": index, **call}]})
    return deltas
