"""The config sections every on-policy RL trainer shares (GRPO and PPO): where episodes run, how
a rollout batch is shaped, and the optional reward-model term. One declaration, one set of
defaults; `grpo_config.py` and `ppo_config.py` embed them.
"""

from __future__ import annotations

import dataclasses

from agentic_rl.config import PositiveInt
from agentic_rl.envs.base import EnvSpec
from agentic_rl.rollout.config import RolloutConfig


@dataclasses.dataclass
class EnvConfig(EnvSpec):
    """The environment episodes run in, and the train-split tasks prompts are drawn from."""

    task_pool: PositiveInt = 2000
    """Train-split tasks to draw prompts from."""


@dataclasses.dataclass
class BatchRolloutConfig(RolloutConfig):
    """How episodes are sampled (every RolloutConfig key) and the batch shape."""

    batch_size: PositiveInt = 8
    """Episodes per rollout batch, over all processes: prompts × group_size."""
    group_size: int = 4
    """G: episodes per prompt. Must divide batch_size."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.group_size < 1:
            raise ValueError(f"rollout.group_size must be >= 1, got {self.group_size}")
        if self.batch_size % self.group_size:
            raise ValueError(
                f"rollout.batch_size={self.batch_size} is not a multiple of rollout.group_size={self.group_size}. "
                "The G episodes of a prompt stay together in one batch (GRPO compares them with each other: "
                "advantage = reward − group mean), so a batch is P whole groups: batch_size = prompts × G. "
                f"Use batch_size={self.group_size * max(1, self.batch_size // self.group_size)} "
                f"or {self.group_size * (self.batch_size // self.group_size + 1)}."
            )
        if self.temperature <= 0:
            raise ValueError("rollout.temperature must be > 0 for on-policy RL: the policy must sample, and its "
                             "log-probs must be those of a distribution")


@dataclasses.dataclass
class RewardModelTerm:
    """An optional learned reward term."""

    path: str = ""
    """A reward model folder from `agentic-rl rm` (empty: no reward-model term)."""
    weight: float = 0.0
    """Its weight in the total reward."""

    def __post_init__(self) -> None:
        if self.weight and not self.path:
            raise ValueError("reward_model.weight is set but reward_model.path is empty; give the folder from `agentic-rl rm`")
