"""`GRPOConfig`: every key of `agentic-rl grpo` (and of the pipeline's `grpo:` section), with its
documentation and its one default. `agentic-rl config grpo` prints them; training/grpo.py trains.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from agentic_rl.algorithms.grpo import GRPOLossConfig
from agentic_rl.algorithms.rollout_correction import RolloutCorrectionConfig
from agentic_rl.config import Config, NonNegativeInt, PositiveInt
from agentic_rl.envs.base import has_oracle, no_oracle_error
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
from agentic_rl.training.groups import GuidanceConfig, SelectionConfig
from agentic_rl.training.loop import LoopConfig, OptimConfig


@dataclasses.dataclass
class GRPORolloutConfig(BatchRolloutConfig):
    """How episodes are sampled (every RolloutConfig key) and the batch shape; G >= 2."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.group_size < 2:
            raise ValueError(
                f"rollout.group_size must be >= 2: GRPO's baseline is the mean of a group (got {self.group_size})"
            )


@dataclasses.dataclass
class AdvantageConfig(Config):
    """What the advantage is computed from."""

    mode: Literal["episode", "turn", "turn_position"] = "episode"
    """episode: one advantage per episode from its composed reward. turn and turn_position: the
    composed reward is placed on the turns (the env_steps term's share on its turns, every other
    term on the last; `training.episodes.rewards_per_turn`), and each turn's advantage is its
    discounted return-to-go G_t minus a group baseline, over the group's std of episode returns
    (`algorithms.turn_credit.turn_advantages`, which states each estimator's bias). turn: the baseline
    is the group mean of the episode returns G_0, for every turn; with γ = 1 and no env_steps term
    it equals episode mode exactly. With step costs or γ < 1 it credits late turns for their small
    remaining cost, even in failed episodes. turn_position: the baseline of turn t is the group
    mean of the returns-to-go at turn t (an ended episode counts 0), so each turn is compared
    with the group's turns at the same point; use it with per-step rewards."""
    gamma: float = 1.0
    """Discount per policy turn for the turn modes: G_t = sum_(k>=t) gamma^(k-t)·r_k. An env_steps
    term with its own gamma has already discounted its rewards from the episode's start
    (gamma_s^k·r_k on turn k), so keep this at 1 with it (a second discount is refused)."""

    def __post_init__(self):
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"advantage.gamma={self.gamma} must be in [0, 1]")
        if self.mode == "episode" and self.gamma != 1.0:
            raise ValueError(
                f"advantage.gamma={self.gamma} is only used by the turn modes (advantage.mode is 'episode'); "
                "discount the episode reward in its reward term (env_steps' gamma), or set advantage.mode: turn_position"
            )


@dataclasses.dataclass
class GRPOLoopConfig(LoopConfig):
    """`agentic-rl grpo`'s loop: LoopConfig with this command's own defaults."""

    steps: NonNegativeInt = 50
    output_dir: str = "runs/grpo"


@dataclasses.dataclass
class GRPOConfig(PluginsConfig):
    """`agentic-rl grpo`: Group Relative Policy Optimization on agent episodes."""

    backend: Literal["agentic_rl", "trl"] = "agentic_rl"
    """agentic_rl: this trainer; trl: the same envs and rewards through TRL's GRPOTrainer."""
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    """The policy and its adapters."""
    env: EnvConfig = dataclasses.field(default_factory=EnvConfig)
    """The environment."""
    rewards: list[RewardSpec] = dataclasses.field(default_factory=lambda: [RewardSpec("env_steps")])
    """Reward terms (see `agentic-rl rewards list`). The default, env_steps, is the env's own return
    Σ_t r_t (its success payout and every step reward); a list without env_steps is refused when
    the env pays step rewards beyond success (rewards/base.py)."""
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
    old_logprobs: OldLogprobs = "sampling"
    """π_old: "sampling" uses the engine's log-probs (free, exact when rollout and training share
    precision); "recompute" takes π_old in the training precision from the first update's own
    forward pass (the weights that sampled the batch, so that update's ratio is exactly 1) and
    keeps it for the μ − 1 updates after it, with no extra pass; "detach" uses
    π_θ.detach() (exact on-policy, μ = 1 only: the ratio is 1 and the gradient is the policy gradient)."""
    rollout_correction: RolloutCorrectionConfig = dataclasses.field(default_factory=RolloutCorrectionConfig)
    """Importance weights π_old/π_sampler on the policy loss, for rollouts decoded by other numerics
    than the trainer (truncated or masked; off by default, logged always)."""
    audit: StartAuditConfig = dataclasses.field(default_factory=StartAuditConfig)
    """The audit of the first batch (prefix, mask, log-prob drift)."""
    micro_batch_size: PositiveInt = 8
    """Rows per forward/backward on each process: a row is one token sequence, so an episode is
    one row, or one per sequence when its env changes the context (memory's window)."""
    skip_zero_advantage: bool = True
    """With beta = 0, leave out of the forward/backward every episode whose advantages are all 0
    (e.g. a group whose G episodes earned the same reward): its loss and gradient are exactly 0,
    and the normalisers still count it, so the update is unchanged. No effect when beta > 0 or
    loss.entropy_coef > 0 (those terms have a gradient) or for loss_type bnpo (its normaliser
    depends on the micro-batch)."""
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    """Optimizer."""
    train: GRPOLoopConfig = dataclasses.field(default_factory=GRPOLoopConfig)
    """Loop, output and checkpoints."""

    def __post_init__(self) -> None:
        if self.loss.loss_type == "dr_grpo":  # its constant denominator is derived, never a key (DR_GRPO_DENOMINATOR)
            budget = min(self.rollout.max_turns * self.rollout.max_turn_tokens, self.rollout.max_episode_tokens)
            self.loss = dataclasses.replace(self.loss, max_completion_length=budget)
        check_old_logprobs(self.old_logprobs, self.updates_per_batch, self.rollout.dtype, self.model.dtype)
        if (
            self.backend == "agentic_rl"
        ):  # TRL places its model itself, from rollout.device (integrations/trl_backend.py)
            check_trainer_device(self.rollout.device)
        discounted = [
            spec.params["gamma"]
            for spec in self.rewards
            if spec.name == "env_steps" and spec.params.get("gamma", 1.0) != 1.0
        ]
        if self.advantage.gamma != 1.0 and discounted:
            raise ValueError(
                f"advantage.gamma={self.advantage.gamma} with an env_steps term of gamma={discounted[0]}: the term already places "
                f"step k's reward on turn k as gamma^k·r_k, so a turn's return-to-go would discount it twice (G_0 would not be the "
                f"episode's reward). Keep advantage.gamma: 1 (then G_t = sum_(k>=t) gamma^k·r_k, the discounted objective's "
                f"policy gradient), or move the discount from the term to advantage.gamma"
            )

    def check(self) -> None:
        """Guidance replays the env's oracle: the env must have one (the validation step)."""
        if self.guidance.enabled and has_oracle(self.env.name) is False:
            raise no_oracle_error(self.env.name, "guidance.enabled", "set guidance.enabled: false")
