"""What the bridges to environment libraries share: the message for a missing optional extra, and
running a library's setup with the network refused.

agentic-rl never downloads at run time. A library that would (textarena's word games fetch NLTK
corpora when first built) must fail before a model loads, saying what it wanted; `offline` makes
any connection attempt inside it fail at once, so the attempt shows as the library's own error
("Resource words not found"), which the bridge reports with the game's name.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Iterator

_LOCK = threading.Lock()


def missing_extra(module: str, extra: str) -> str:
    """The error text for an optional library that is not installed."""
    return (f"the {module} bridge needs the optional package {extra!r}, which is not installed: "
            f"pip install 'agentic-rl[{extra}]' (or pip install {extra})")


@contextlib.contextmanager
def offline(what: str) -> Iterator[None]:
    """Refuse every outgoing connection of this process while the block runs (one block at a
    time), so a library that would download data fails at once and names it."""

    def refuse(sock: socket.socket, address: object, *args: object) -> None:
        raise ConnectionRefusedError(f"{what} tried to connect to {address!r}: agentic-rl never downloads at run time")

    with _LOCK:
        original = socket.socket.connect
        socket.socket.connect = refuse  # type: ignore[method-assign]
        try:
            yield
        finally:
            socket.socket.connect = original  # type: ignore[method-assign]
