"""`GRPOConfig`: every key of `agentic-rl grpo` (and of the pipeline's `grpo:` section), with its
documentation and its one default. `agentic-rl config grpo` prints them; training/grpo.py trains.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from agentic_rl.algorithms.grpo import GRPOLossConfig
from agentic_rl.config import PositiveInt
from agentic_rl.envs.base import EnvSpec
from agentic_rl.models.policy import ModelConfig
from agentic_rl.rewards.base import RewardSpec
from agentic_rl.rollout.config import RolloutConfig
from agentic_rl.training.groups import GuidanceConfig, SelectionConfig
from agentic_rl.training.loop import LoopConfig, OptimConfig


@dataclasses.dataclass
class EnvConfig(EnvSpec):
    """The environment episodes run in, and the train-split tasks prompts are drawn from."""

    task_pool: PositiveInt = 2000
    """Train-split tasks to draw prompts from."""


@dataclasses.dataclass
class GRPORolloutConfig(RolloutConfig):
    """How episodes are sampled (every RolloutConfig key) and the batch shape."""

    batch_size: PositiveInt = 8
    """Episodes per rollout batch, over all processes: prompts × group_size."""
    group_size: int = 4
    """G: episodes per prompt. Must divide batch_size."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.group_size < 2:
            raise ValueError(f"rollout.group_size must be >= 2: GRPO's baseline is the mean of a group (got {self.group_size})")
        if self.batch_size % self.group_size:
            raise ValueError(
                f"rollout.batch_size={self.batch_size} is not a multiple of rollout.group_size={self.group_size}. "
                "GRPO compares the G episodes of the same prompt with each other (advantage = reward − group mean), "
                "so a batch is P whole groups: batch_size = prompts × G. "
                f"Use batch_size={self.group_size * max(1, self.batch_size // self.group_size)} "
                f"or {self.group_size * (self.batch_size // self.group_size + 1)}."
            )
        if self.temperature <= 0:
            raise ValueError("rollout.temperature must be > 0 for GRPO: the group needs diverse samples")


@dataclasses.dataclass
class AdvantageConfig:
    """What the advantage is computed from."""

    mode: Literal["episode", "turn"] = "episode"
    """episode: one advantage per episode from its total reward; turn: per-turn discounted returns
    of the env's per-step rewards, with the episode reward added at the last turn."""
    gamma: float = 1.0
    """Discount per policy turn for mode=turn."""


@dataclasses.dataclass
class RewardModelTerm:
    """An optional learned reward term."""

    path: str = ""
    """A reward model folder from `agentic-rl rm` (empty: no reward-model term)."""
    weight: float = 0.0
    """Its weight in the total reward."""


@dataclasses.dataclass
class GRPOConfig:
    """`agentic-rl grpo`: Group Relative Policy Optimization on agent episodes."""

    backend: Literal["agentic_rl", "trl"] = "agentic_rl"
    """agentic_rl: this trainer; trl: the same envs and rewards through TRL's GRPOTrainer."""
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    """The policy and its adapters."""
    env: EnvConfig = dataclasses.field(default_factory=EnvConfig)
    """The environment."""
    rewards: list[RewardSpec] = dataclasses.field(default_factory=lambda: [RewardSpec("accuracy")])
    """Reward terms (see `agentic-rl rewards list`)."""
    reward_model: RewardModelTerm = dataclasses.field(default_factory=RewardModelTerm)
    """Optional reward-model term."""
    rollout: GRPORolloutConfig = dataclasses.field(default_factory=GRPORolloutConfig)
    """Sampling."""
    loss: GRPOLossConfig = dataclasses.field(default_factory=GRPOLossConfig)
    """The GRPO objective and its variants."""
    advantage: AdvantageConfig = dataclasses.field(default_factory=AdvantageConfig)
    """Advantage source."""
    selection: SelectionConfig = dataclasses.field(default_factory=SelectionConfig)
    """Which prompts and groups a batch trains on (dynamic sampling, success-rate band)."""
    guidance: GuidanceConfig = dataclasses.field(default_factory=GuidanceConfig)
    """Off-policy oracle demonstrations in groups that all fail (off by default)."""
    updates_per_batch: PositiveInt = 1
    """μ: optimizer steps per rollout batch."""
    old_logprobs: Literal["sampling", "recompute", "detach"] = "sampling"
    """π_old: "sampling" uses the engine's log-probs (free, exact when rollout and training share
    precision); "recompute" re-scores the batch once before the first update; "detach" uses
    π_θ.detach() (exact on-policy, μ = 1 only: the ratio is 1 and the gradient is the policy gradient)."""
    micro_batch_size: PositiveInt = 8
    """Episodes per forward/backward on each process."""
    skip_zero_advantage: bool = True
    """With beta = 0, leave out of the forward/backward every episode whose advantages are all 0
    (e.g. a group whose G episodes earned the same reward): its loss and gradient are exactly 0,
    and the normalisers still count it, so the update is unchanged. No effect when beta > 0 or
    loss.entropy_coef > 0 (those terms have a gradient) or for loss_type bnpo (its normaliser
    depends on the micro-batch)."""
    optim: OptimConfig = dataclasses.field(default_factory=lambda: OptimConfig(lr=1e-5))
    """Optimizer."""
    train: LoopConfig = dataclasses.field(default_factory=lambda: LoopConfig(steps=50, output_dir="runs/grpo"))
    """Loop, output and checkpoints."""

    def __post_init__(self) -> None:
        if self.updates_per_batch < 1 or self.micro_batch_size < 1:
            raise ValueError("updates_per_batch and micro_batch_size must be >= 1")
        if self.advantage.mode == "turn" and any(r.name == "env_steps" for r in self.rewards):
            raise ValueError("advantage.mode=turn already uses the env's per-step rewards; remove the env_steps reward term")
        if self.old_logprobs == "detach" and self.updates_per_batch > 1:
            raise ValueError("old_logprobs=detach pins the ratio at 1, which is only right for the first update; "
                             "with updates_per_batch > 1 use sampling or recompute")
        if self.rollout.dtype != self.model.dtype and self.old_logprobs == "sampling":
            raise ValueError(f"rollout.dtype={self.rollout.dtype} samples with other weights than the trained "
                             f"{self.model.dtype} model, so its log-probs are not π_old; set old_logprobs: detach (μ = 1) "
                             f"or recompute, or rollout.dtype: {self.model.dtype}")
        if self.reward_model.weight and not self.reward_model.path:
            raise ValueError("reward_model.weight is set but reward_model.path is empty; give the folder from `agentic-rl rm`")
