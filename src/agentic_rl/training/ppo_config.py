"""`PPOConfig`: every key of `agentic-rl ppo` (and of the pipeline's `ppo:` section), with its
documentation and its one default. `agentic-rl config ppo` prints them; training/ppo.py trains.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from agentic_rl.algorithms.ppo import PPOLossConfig
from agentic_rl.algorithms.rollout_correction import RolloutCorrectionConfig
from agentic_rl.config import Config, NonNegativeInt, PositiveFloat, PositiveInt, refuse_unused
from agentic_rl.models.policy import ModelConfig
from agentic_rl.plugins import PluginsConfig
from agentic_rl.rewards.base import RewardSpec
from agentic_rl.training.episode_config import (
    BatchRolloutConfig,
    EnvConfig,
    OldLogprobs,
    RewardModelTerm,
    StartAuditConfig,
    check_old_logprobs,
    check_trainer_device,
)
from agentic_rl.training.groups import SelectionConfig
from agentic_rl.training.loop import LoopConfig, OptimConfig


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
class PPOConfig(PluginsConfig):
    """`agentic-rl ppo`: PPO with a value model and GAE on agent episodes."""

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    """The policy and its adapters."""
    env: EnvConfig = dataclasses.field(default_factory=EnvConfig)
    """The environment."""
    rewards: list[RewardSpec] = dataclasses.field(default_factory=lambda: [RewardSpec("env_steps")])
    """Reward terms (see `agentic-rl rewards list`); the default, env_steps, is the env's own return
    (rewards/base.py says how the terms combine). The env_steps term's share of each turn sits on
    that turn's last token, every other term on the episode's last policy token."""
    reward_model: RewardModelTerm = dataclasses.field(default_factory=RewardModelTerm)
    """Optional reward-model term."""
    rollout: PPORolloutConfig = dataclasses.field(default_factory=PPORolloutConfig)
    """Sampling."""
    loss: PPOLossConfig = dataclasses.field(default_factory=PPOLossConfig)
    """The PPO objective: clip ranges, GAE's γ and λ, the KL and where it goes."""
    value: ValueConfig = dataclasses.field(default_factory=ValueConfig)
    """The value model."""
    selection: SelectionConfig = dataclasses.field(default_factory=SelectionConfig)
    """Which prompts a batch trains on (success-rate band; dynamic sampling needs group_size >= 2)."""
    updates_per_batch: PositiveInt = 1
    """μ: optimizer steps per rollout batch (PPO epochs; each one over the whole batch)."""
    old_logprobs: OldLogprobs = "sampling"
    """π_old: "sampling" uses the engine's log-probs; "recompute" re-scores the batch once before
    the first update; "detach" uses π_θ.detach() (μ = 1 only). As for GRPO."""
    rollout_correction: RolloutCorrectionConfig = dataclasses.field(default_factory=RolloutCorrectionConfig)
    """Importance weights π_old/π_sampler on the policy loss, for rollouts decoded by other numerics
    than the trainer (truncated or masked; off by default, logged always)."""
    audit: StartAuditConfig = dataclasses.field(default_factory=StartAuditConfig)
    """The audit of the first batch (prefix, mask, log-prob drift)."""
    micro_batch_size: PositiveInt = 8
    """Rows per forward/backward on each process: a row is one token sequence, so an episode is
    one row, or one per sequence when its env changes the context (memory's window)."""
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    """Optimizer (the value model's learning rate is scaled by value.lr_multiplier)."""
    train: PPOLoopConfig = dataclasses.field(default_factory=PPOLoopConfig)
    """Loop, output and checkpoints."""

    def __post_init__(self) -> None:
        if self.selection.dynamic_sampling and self.rollout.group_size < 2:
            raise ValueError(
                "selection.dynamic_sampling keeps groups whose rewards differ, which needs rollout.group_size >= 2"
            )
        check_old_logprobs(self.old_logprobs, self.updates_per_batch, self.rollout.dtype, self.model.dtype)
        check_trainer_device(self.rollout.device)
