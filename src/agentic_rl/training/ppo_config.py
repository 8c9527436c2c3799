"""`PPOConfig`: every key of `agentic-rl ppo` (and of the pipeline's `ppo:` section), with its
documentation and its one default. `agentic-rl config ppo` prints them; training/ppo.py trains.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from agentic_rl.algorithms.ppo import PPOLossConfig
from agentic_rl.config import Config, NonNegativeInt, PositiveFloat, refuse_unused
from agentic_rl.training.episode_config import (
    BatchRolloutConfig,
    check_trainer_device,
)
from agentic_rl.training.loop import LoopConfig
from agentic_rl.training.on_policy_config import OnPolicyConfig


@dataclasses.dataclass
class PPORolloutConfig(BatchRolloutConfig):
    """How episodes are sampled (every RolloutConfig key) and the batch shape."""

    group_size: int = 1
    """Episodes per prompt (PPO's baseline is the value model, so 1 is enough; more gives the
    value model several returns of one state)."""


@dataclasses.dataclass
class ValueConfig(Config):
    """The value model V(s): a scalar head read at every state the policy samples a token from."""

    critic: Literal["shared", "separate"] = "shared"
    """shared: a linear head on the policy's own backbone (the LoRA trunk is shared, so the value
    loss also shapes the policy's features; no second model in memory). separate: a second copy
    of the model with its own adapters and head (twice the weights and activations; the value loss
    never touches the policy)."""
    model: str = ""
    """The separate critic's starting weights: any `model.name` (a built-in name, a folder, a
    stage's `final/`), or a reward model from `agentic-rl rm` (its `final/`): then the critic is
    the RM's decoder and the value head starts from the RM's score head, so V(s) starts as the
    RM's score of the conversation up to s instead of 0. Empty: the policy's own `model.name`.
    Refused with critic: shared (the critic is then the policy itself)."""
    lr_multiplier: PositiveFloat = 1.0
    """The value head (and a separate critic) learn at optim.lr × this. Mind Adam's first steps:
    they move every weight by about the learning rate, so a zero-initialised head's value jumps
    by ≈ lr · ‖h‖₁ (h: the hidden state, 576 wide for SmolLM2). At × 10 the demo's value head
    overshot the returns in one step and its gradient crowded out the policy's in the clipped
    norm (EXPERIMENTS.md, PPO value head); × 1 is the default."""

    def __post_init__(self) -> None:
        if self.critic == "shared":
            refuse_unused(
                self, ["model"], prefix="value.", used_with="value.critic: separate", now="value.critic is 'shared'"
            )


@dataclasses.dataclass
class PPOLoopConfig(LoopConfig):
    """`agentic-rl ppo`'s loop: LoopConfig with this command's own defaults."""

    steps: NonNegativeInt = 50
    output_dir: str = "runs/ppo"


@dataclasses.dataclass
class PPOConfig(OnPolicyConfig):
    """`agentic-rl ppo`: PPO with a value model and GAE on agent episodes."""

    rollout: PPORolloutConfig = dataclasses.field(default_factory=PPORolloutConfig)
    """Sampling."""
    train: PPOLoopConfig = dataclasses.field(default_factory=PPOLoopConfig)
    """Loop, output and checkpoints."""
    loss: PPOLossConfig = dataclasses.field(default_factory=PPOLossConfig)
    """The PPO objective: clip ranges, GAE's γ and λ, the KL and where it goes."""
    value: ValueConfig = dataclasses.field(default_factory=ValueConfig)
    """The value model."""

    def __post_init__(self) -> None:
        if self.selection.dynamic_sampling and self.rollout.group_size < 2:
            raise ValueError(
                "selection.dynamic_sampling keeps groups whose rewards differ, which needs rollout.group_size >= 2"
            )
        super().__post_init__()
        check_trainer_device(self.rollout.device)
