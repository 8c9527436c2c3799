"""What the bridges to environment libraries share: the message for a missing optional extra,
running a library's setup with the network refused, and the disjoint train/test seeds of a
library whose problems (or games) are drawn from a seeded generator without end.

agentic-rl never downloads at run time. A library that would (textarena's word games fetch NLTK
corpora when first built, a verifiers environment its hub dataset) must fail before a model loads,
saying what it wanted; `offline` makes any connection attempt inside it fail at once, so the
attempt shows as the library's own error ("Resource words not found", "Couldn't reach
'openai/gsm8k' on the Hub"), which the bridge reports with the task's name.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
from typing import Iterator

_LOCK = threading.Lock()

SPLIT_SPAN = 1_000_000_000
"""Generator seeds a split may use: train of seed s takes [2s·SPAN, 2s·SPAN + n), test the next SPAN."""


def missing_extra(module: str, extra: str) -> str:
    """The error text for an optional library that is not installed."""
    return (
        f"the {module} bridge needs the optional package {extra!r}, which is not installed: "
        f"pip install 'agentic-rl[{extra}]' (or pip install {extra})"
    )


@contextlib.contextmanager
def offline(what: str) -> Iterator[None]:
    """Refuse every outgoing connection of this process while the block runs (one block at a
    time), so a library that would download data fails at once and names it.

    The Hugging Face hub and datasets libraries (where imported) are put in their offline mode too:
    they would otherwise retry a refused connection with backoff for half a minute, and offline they
    fall back to their local cache, which is no download."""

    def refuse(sock: socket.socket, address: object, *args: object) -> None:
        raise ConnectionRefusedError(f"{what} tried to connect to {address!r}: agentic-rl never downloads at run time")

    hub_flags = [
        module for name in ("huggingface_hub.constants", "datasets.config") if (module := sys.modules.get(name))
    ]
    with _LOCK:
        original = socket.socket.connect
        saved = [(module, module.HF_HUB_OFFLINE) for module in hub_flags]
        socket.socket.connect = refuse  # type: ignore[method-assign]
        for module in hub_flags:
            module.HF_HUB_OFFLINE = True
        try:
            yield
        finally:
            socket.socket.connect = original  # type: ignore[method-assign]
            for module, value in saved:
                module.HF_HUB_OFFLINE = value


def split_base(library: str, split: str, n: int | None, seed: int) -> int:
    """The first generator seed of `n` tasks of `split` under `seed`: task i is drawn with seed
    base + i, so train and test (and two seeds) never share a generator seed for n < SPLIT_SPAN."""
    if split not in ("train", "test"):
        raise ValueError(f"unknown split {split!r}; {library} has 'train' and 'test'")
    if n is None:
        raise ValueError(f"{library} draws tasks from a seeded generator without end; pass n, the number of tasks")
    if not 0 <= n < SPLIT_SPAN:
        raise ValueError(f"n must be in [0, {SPLIT_SPAN}), got {n}")
    return seed * 2 * SPLIT_SPAN + (SPLIT_SPAN if split == "test" else 0)
