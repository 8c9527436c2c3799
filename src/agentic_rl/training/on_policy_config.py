"""`OnPolicyConfig`: the keys `agentic-rl grpo` and `ppo` share, each with its documentation and its
one default; grpo_config.py and ppo_config.py add what differs (the loss, the advantage or the
value model, GRPO's group levers) and their own rollout and loop defaults.
"""

from __future__ import annotations

import dataclasses

from agentic_rl.algorithms.rollout_correction import RolloutCorrectionConfig
from agentic_rl.config import PositiveInt
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
)
from agentic_rl.training.groups import SelectionConfig
from agentic_rl.training.loop import LoopConfig, OptimConfig


@dataclasses.dataclass
class OnPolicyConfig(PluginsConfig):
    """What an on-policy RL command (GRPO, PPO) samples, scores and trains with."""

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    """The policy and its adapters."""
    env: EnvConfig = dataclasses.field(default_factory=EnvConfig)
    """The environment."""
    rewards: list[RewardSpec] = dataclasses.field(default_factory=lambda: [RewardSpec("env_steps")])
    """Reward terms (see `agentic-rl rewards list`). The default, env_steps, is the env's own return
    Σ_t r_t (its success payout and every step reward); a list without env_steps is refused when
    the env pays step rewards beyond success (rewards/base.py says how the terms combine). PPO
    places the env_steps term's share of each turn on that turn's last token, every other term on
    the episode's last policy token."""
    reward_model: RewardModelTerm = dataclasses.field(default_factory=RewardModelTerm)
    """Optional reward-model term."""
    rollout: BatchRolloutConfig = dataclasses.field(default_factory=BatchRolloutConfig)
    """Sampling."""
    selection: SelectionConfig = dataclasses.field(default_factory=SelectionConfig)
    """Which prompts and groups a batch trains on (dynamic sampling, which needs rollout.group_size
    >= 2; success-rate band)."""
    updates_per_batch: PositiveInt = 1
    """μ: optimizer steps per rollout batch (PPO's epochs, each over the whole batch)."""
    old_logprobs: OldLogprobs = "sampling"
    """π_old: "sampling" uses the engine's log-probs (free, exact when rollout and training share
    precision); "recompute" takes π_old in the training precision from the weights that sampled the
    batch: GRPO keeps its first update's own forward for the μ − 1 updates after it (that update's
    ratio is exactly 1, and no extra pass runs), PPO reads it from its value pass before the first
    update; "detach" uses π_θ.detach() (exact on-policy, μ = 1 only: the ratio is 1 and the
    gradient is the policy gradient)."""
    rollout_correction: RolloutCorrectionConfig = dataclasses.field(default_factory=RolloutCorrectionConfig)
    """Importance weights π_old/π_sampler on the policy loss, for rollouts decoded by other numerics
    than the trainer (truncated or masked; off by default, logged always)."""
    audit: StartAuditConfig = dataclasses.field(default_factory=StartAuditConfig)
    """The audit of the first batch (prefix, mask, log-prob drift)."""
    micro_batch_size: PositiveInt = 8
    """Rows per forward/backward on each process: a row is one token sequence, so an episode is
    one row, or one per sequence when its env changes the context (memory's window)."""
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    """Optimizer (PPO's value model learns at its lr × value.lr_multiplier)."""
    train: LoopConfig = dataclasses.field(default_factory=LoopConfig)
    """Loop, output and checkpoints."""

    def __post_init__(self) -> None:
        check_old_logprobs(self.old_logprobs, self.updates_per_batch, self.rollout.dtype, self.model.dtype)
