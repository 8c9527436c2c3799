"""Which trainer runs `agentic-rl grpo`: ours (training/grpo.py) or TRL's GRPOTrainer
(`backend: trl`, integrations/trl_backend.py). The CLI and the pipeline call this; training/
never imports integrations/ (docs/design.md invariant 9, arrows point down)."""

from __future__ import annotations

from typing import Any

from agentic_rl.integrations.trl_backend import train_grpo_trl
from agentic_rl.training.grpo import train_grpo
from agentic_rl.training.grpo_config import GRPOConfig


def train_grpo_with_backend(cfg: GRPOConfig) -> dict[str, Any]:
    """Run GRPO with `cfg.backend`; {"final", "history"}."""
    if cfg.backend == "trl":
        return train_grpo_trl(cfg)

    return train_grpo(cfg)
