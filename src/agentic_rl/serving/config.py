"""`ServeConfig`: what `agentic-rl serve` serves and how. Torch-free, so the CLI's help is instant."""

from __future__ import annotations

import dataclasses
from typing import Annotated, ClassVar

from agentic_rl.config import Config, Interval, PositiveFloat, PositiveInt, require_model
from agentic_rl.envs.base import EnvSpec
from agentic_rl.plugins import PluginsConfig
from agentic_rl.rollout.config import RolloutConfig


@dataclasses.dataclass
class HTTPLimits(Config):
    """Limits on what one client may make the server read, hold or wait for (`agentic-rl serve`'s `http:`)."""

    max_body_bytes: PositiveInt = 4 * 2**20
    """Largest request body in bytes (4 MiB); a larger one is answered 413 before it is read (from its
    Content-Length) or as soon as the bytes received pass the limit (a chunked body)."""
    max_json_depth: PositiveInt = 64
    """Deepest nesting of arrays and objects in a request body, and in a tool call's `arguments`; a
    deeper one is a 400 (CPython's parser fails near 1,000 levels, the chat template's tojson sooner)."""
    read_timeout_s: PositiveFloat = 10.0
    """Seconds a connection has to send a request's headers (from connecting, or from the end of its
    previous response), and then as long again for its body; past the first the connection is
    closed, past the second the request is answered 408."""
    idle_timeout_s: PositiveFloat = 5.0
    """Seconds an idle keep-alive connection stays open after a response (uvicorn's timeout_keep_alive)."""
    max_messages: PositiveInt = 1024
    """Most messages in one request, checked before anything is rendered; more is a 400 (the body's
    size bounds its characters: max_body_bytes)."""
    max_parsing_bytes: PositiveInt = 4 * 2**20
    """Most bytes of request bodies over 64 KiB parsed at once (4 MiB: one body at the size limit); a
    large body waits its turn (up to read_timeout_s, then 429), so large bodies cannot fill the
    memory and the parsing threads while small requests parse at once, beside them."""
    max_concurrent_requests: PositiveInt = 64
    """Most chat requests in flight at once (reading, queued or decoding); more are answered 429
    at once, with Retry-After. Bounds the memory requests hold: at most this many bodies of
    `max_body_bytes`."""


@dataclasses.dataclass
class ServeConfig(PluginsConfig):
    """`agentic-rl serve`: an OpenAI-compatible HTTP server on the rollout engine (serving/server.py)."""

    RENAMED_KEYS: ClassVar[dict[str, str]] = {"max_batch": "max_concurrent (requests decoded at once)"}

    model: str = ""
    """Built-in name, HF directory, hub id, or a stage's final/ folder."""
    served_name: str = ""
    """The model id clients name in requests and /v1/models lists (default: the `model` string)."""
    env: EnvSpec | None = None
    """None: model mode (the request's tools go into the chat template; tool calls come back to the
    client). An environment, e.g. {name: arith}: agent mode (the server runs the environment's tools
    itself and answers with the final reply and the tool trace)."""
    host: str = "127.0.0.1"
    """Address to listen on (0.0.0.0: every interface; the server has no authentication)."""
    port: int = 8000
    """TCP port to listen on."""
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    """Limits and defaults of every request: max_turn_tokens is the default `max_tokens` (a request may
    ask for more, up to max_episode_tokens), max_turns bounds agent mode's tool loop, sampling (temperature,
    top_p, top_k) holds the defaults a request overrides; backend and dtype as everywhere."""
    max_concurrent: PositiveInt = 16
    """Most requests decoded at once, in one engine batch (the backend's slots). The same name as eval's."""
    batch_window_ms: Annotated[float, Interval("[0, 10000]")] = 20.0
    """After a request arrives at an idle engine, wait this long for others to join its batch."""
    http: HTTPLimits = dataclasses.field(default_factory=HTTPLimits)
    """What one client may make the server read, hold or wait for: body size, JSON nesting, timeouts,
    requests in flight (serving/request_body.py, serving/connections.py)."""
    seed: int = 0
    """Base of the seeds of requests that name none (request i gets seed + i); a request's `seed` wins."""

    def __post_init__(self) -> None:
        require_model(self.model)
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")

    @property
    def model_id(self) -> str:
        """The id requests must name."""
        return self.served_name or self.model
