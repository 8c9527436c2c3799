"""Connection limits of `agentic-rl serve`: a deadline for each request's headers, on uvicorn's h11 protocol.

    uvicorn.run(app, host=..., port=..., **uvicorn_options(cfg.http))   # as server.serve does

Why: uvicorn (0.3x-0.55) arms its only timer, `timeout_keep_alive`, after a response, and disarms
it on every byte received. A connection that never sends a request, or sends half its headers
(slowloris: a byte every few seconds), is therefore held open forever, with its file descriptor
and its buffer. Here each connection gets one deadline per request, armed when it connects and
when a response ends, disarmed when h11 has parsed the request's headers, and not moved by
partial data: past it the connection is closed (there is no request yet to answer).

The body has its own limit (serving/request_body.py: 408 after `read_timeout_s`); a body left
unread after a 413 is drained and discarded by uvicorn, within the next request's deadline.
Header size is bounded by uvicorn's `h11_max_incomplete_event_size` (16 KiB: a 400, then close).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from agentic_rl.serving.config import HTTPLimits


def uvicorn_options(limits: HTTPLimits) -> dict[str, Any]:
    """uvicorn's options for the connection limits in `limits`: the header deadline and the keep-alive idle time."""
    return {"http": header_deadline_protocol(limits.read_timeout_s), "timeout_keep_alive": limits.idle_timeout_s}


def header_deadline_protocol(header_timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol, closing a connection whose request headers are not in within `header_timeout_s`."""

    class HeaderDeadlineProtocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def handle_events(self) -> None:
            cycle = self.cycle
            super().handle_events()
            if self.cycle is not cycle:  # h11 parsed a request's headers: it has an ASGI cycle now
                self._disarm()

        def on_response_complete(self) -> None:
            self._arm()  # before the parent: it may parse a pipelined request, which disarms
            super().on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(header_timeout_s, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                self.transport.close()

    return HeaderDeadlineProtocol
