"""A chat request's body, read and parsed under the server's `HTTPLimits` (serving/config.py).

    raw = await read_body(request, limits)                        # bytes, or an APIError 413 / 408
    async with budget.hold(len(raw)):                              # large bodies take turns (ParseBudget)
        chat = await run_in_threadpool(decode_chat_request, raw, ...)  # JSON parsed and checked off the event loop

A body is refused before it is read when its Content-Length is over `max_body_bytes`, and while
it streams as soon as the bytes received pass it (a chunked body has no Content-Length), so a
20 MB body never sits in memory. Parsing then runs on a worker thread, never on the event loop
that answers the other requests, and bodies over 64 KiB take turns within `max_parsing_bytes`
(`ParseBudget`): sixteen 4 MiB bodies of `[{},{},...]` parsed at once held 3 GiB and kept small
requests waiting 33 s. A value nested deeper than `max_json_depth` is a 400: CPython's parser
raises RecursionError near 1,000 levels, and the chat template's `tojson` recurses too. More than
`max_messages` messages is a 400 before anything is rendered.

Connection-level limits (the header deadline, the keep-alive idle time) are in
serving/connections.py; the bound on requests in flight is in server.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator

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
        raise APIError(
            408,
            f"the request body did not arrive within {limits.read_timeout_s:g} s (this server's "
            f"http.read_timeout_s); {received:,} bytes came",
            code="request_timeout",
        ) from None
    return b"".join(chunks)


SMALL_BODY_BYTES = 64 * 2**10
"""Bodies up to this size parse at once, outside the ParseBudget: a chat turn's request is far smaller."""


class ParseBudget:
    """Bytes of large bodies (over SMALL_BODY_BYTES) being parsed at once, at most
    `http.max_parsing_bytes`: a large body waits for its turn, up to `http.read_timeout_s`, then is
    answered 429. A body larger than the budget alone runs alone."""

    def __init__(self, limits: HTTPLimits) -> None:
        self.limits, self.used = limits, 0
        self._changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def hold(self, size: int) -> AsyncIterator[None]:
        if size <= SMALL_BODY_BYTES:
            yield
            return
        try:
            async with asyncio.timeout(self.limits.read_timeout_s), self._changed:
                await self._changed.wait_for(
                    lambda: self.used == 0 or self.used + size <= self.limits.max_parsing_bytes
                )
                self.used += size
        except TimeoutError:
            raise APIError(
                429,
                f"this server is parsing {self.used:,} bytes of other large request bodies, its limit "
                "(http.max_parsing_bytes); retry shortly",
                kind="requests",
                code="rate_limit_exceeded",
            ) from None
        try:
            yield
        finally:
            async with self._changed:
                self.used -= size
                self._changed.notify_all()


def decode_chat_request(
    raw: bytes, model_id: str, rollout_limits: Any, agent_mode: bool, limits: HTTPLimits
) -> ChatRequest:
    """`parse_chat_request` of the JSON in `raw`: at most `limits.max_messages` messages (counted before
    anything else is checked), every value, and every tool call's `arguments`, nested at most
    `limits.max_json_depth`."""
    body = parse_json(raw, limits.max_json_depth)
    messages = body.get("messages") if isinstance(body, dict) else None
    if isinstance(messages, list) and len(messages) > limits.max_messages:
        raise APIError(
            400,
            f"the request holds {len(messages):,} messages; this server accepts at most "
            f"{limits.max_messages:,} (http.max_messages): send a shorter conversation",
            "messages",
            "too_many_messages",
        )
    request = parse_chat_request(body, model_id, rollout_limits, agent_mode)
    for index, message in enumerate(request.messages):
        for k, call in enumerate(message.get("tool_calls") or []):
            where = f"messages[{index}].tool_calls[{k}].function.arguments"
            parse_json(call["function"].get("arguments") or "{}", limits.max_json_depth, f"'{where}'", where)
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
    return APIError(
        413,
        f"the request body {how}; this server accepts at most {limits.max_body_bytes:,} bytes "
        "(http.max_body_bytes): send a shorter conversation",
        code="request_too_large",
    )


def _too_deep(what: str, depth: str, max_depth: int, param: str | None) -> APIError:
    return APIError(
        400,
        f"{what} nests arrays and objects {depth} levels deep; this server accepts at most "
        f"{max_depth} (http.max_json_depth)",
        param,
        "json_too_deep",
    )
