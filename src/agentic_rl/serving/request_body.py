"""A chat request's body, read and parsed under the server's `HTTPLimits` (serving/config.py).

    raw = await read_body(request, limits)                        # bytes, or an APIError 413 / 408
    chat = await run_in_threadpool(decode_chat_request, raw, ...)  # JSON parsed and checked off the event loop

A body is refused before it is read when its Content-Length is over `max_body_bytes`, and while
it streams as soon as the bytes received pass it (a chunked body has no Content-Length), so a
20 MB body never sits in memory. Parsing then runs on a worker thread, never on the event loop
that answers the other requests. A value nested deeper than `max_json_depth` is a 400: CPython's
parser raises RecursionError near 1,000 levels, and the chat template's `tojson` recurses too.

Connection-level limits (the header deadline, the keep-alive idle time) are in
serving/connections.py; the bound on requests in flight is in server.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request

from agentic_rl.serving.config import HTTPLimits
from agentic_rl.serving.openai_api import APIError, ChatRequest, parse_chat_request
from agentic_rl.strict_json import NotUnicodeError, loads_data


async def read_body(request: Request, limits: HTTPLimits) -> bytes:
    """The request's body bytes, at most `limits.max_body_bytes`, arriving within `limits.read_timeout_s`."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limits.max_body_bytes:
        raise _too_large(f"declares {int(declared):,} bytes (Content-Length)", limits)
    chunks, received = [], 0
    try:
        async with asyncio.timeout(limits.read_timeout_s):
            async for chunk in request.stream():
                received += len(chunk)
                if received > limits.max_body_bytes:
                    raise _too_large(f"passed {limits.max_body_bytes:,} bytes while it streamed", limits)
                chunks.append(chunk)
    except TimeoutError:
        raise APIError(408, f"the request body did not arrive within {limits.read_timeout_s:g} s (this server's "
                       f"http.read_timeout_s); {received:,} bytes came", code="request_timeout") from None
    return b"".join(chunks)


def decode_chat_request(raw: bytes, model_id: str, rollout_limits: Any, agent_mode: bool, max_json_depth: int) -> ChatRequest:
    """`parse_chat_request` of the JSON in `raw`, with every tool call's `arguments` nested at most `max_json_depth`."""
    request = parse_chat_request(parse_json(raw, max_json_depth), model_id, rollout_limits, agent_mode)
    for index, message in enumerate(request.messages):
        for k, call in enumerate(message.get("tool_calls") or []):
            where = f"messages[{index}].tool_calls[{k}].function.arguments"
            parse_json(call["function"].get("arguments") or "{}", max_json_depth, f"'{where}'", where)
    return request


def parse_json(raw: bytes | str, max_depth: int, what: str = "the request body", param: str | None = None) -> Any:
    """`raw` as JSON nested at most `max_depth` levels, or an APIError 400 naming `what` (and the field `param`)."""
    try:
        value = loads_data(raw)  # a repeated key or a lone surrogate is a 400 naming where it is
    except RecursionError:
        raise _too_deep(what, "about a thousand", max_depth, param) from None
    except NotUnicodeError as exc:
        raise APIError(400, f"{what}: {exc}", param or exc.where or None) from None
    except ValueError as exc:  # UnicodeDecodeError is one
        raise APIError(400, f"{what} is not valid JSON: {exc}", param) from None
    depth = json_depth(value)
    if depth > max_depth:
        raise _too_deep(what, str(depth), max_depth, param)
    return value


def json_depth(value: Any) -> int:
    """Levels of arrays and objects in a parsed JSON value (a scalar: 0). Iterative, so no recursion limit."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def _too_large(how: str, limits: HTTPLimits) -> APIError:
    return APIError(413, f"the request body {how}; this server accepts at most {limits.max_body_bytes:,} bytes "
                    "(http.max_body_bytes): send a shorter conversation", code="request_too_large")


def _too_deep(what: str, depth: str, max_depth: int, param: str | None) -> APIError:
    return APIError(400, f"{what} nests arrays and objects {depth} levels deep; this server accepts at most "
                    f"{max_depth} (http.max_json_depth)", param, "json_too_deep")
