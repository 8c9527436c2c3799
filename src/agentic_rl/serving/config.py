"""`ServeConfig`: what `agentic-rl serve` serves and how. Torch-free, so the CLI's help is instant."""

from __future__ import annotations

import dataclasses

from agentic_rl.config import PositiveInt, require_model
from agentic_rl.envs.base import EnvSpec
from agentic_rl.rollout.config import RolloutConfig


@dataclasses.dataclass
class ServeConfig:
    """`agentic-rl serve`: an OpenAI-compatible HTTP server on the rollout engine (serving/server.py)."""

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
    ask for more, up to max_episode_tokens), max_turns bounds agent mode's tool loop, temperature and
    top_p are the defaults a request overrides; backend and dtype as everywhere."""
    max_batch: PositiveInt = 16
    """Most requests decoded together in one engine batch (the backend's slots)."""
    batch_window_ms: float = 20.0
    """After a request arrives at an idle engine, wait this long for others to join its batch (>= 0)."""
    seed: int = 0
    """Base of the seeds of requests that name none (request i gets seed + i); a request's `seed` wins."""

    def __post_init__(self) -> None:
        require_model(self.model)
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        if not 0.0 <= self.batch_window_ms <= 10_000:
            raise ValueError(f"batch_window_ms must be in [0, 10000], got {self.batch_window_ms}")

    @property
    def model_id(self) -> str:
        """The id requests must name."""
        return self.served_name or self.model
