"""`GRPOConfig`: every key of `agentic-rl grpo` (and of the pipeline's `grpo:` section), with its
documentation and its one default. `agentic-rl config grpo` prints them; training/grpo.py trains.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

from agentic_rl.algorithms.grpo import GRPOLossConfig
from agentic_rl.config import Config, Fraction, NonNegativeInt
from agentic_rl.envs.base import has_oracle, no_oracle_error
from agentic_rl.training.episode_config import (
    BatchRolloutConfig,
    check_trainer_device,
)
from agentic_rl.training.groups import GuidanceConfig
from agentic_rl.training.loop import LoopConfig
from agentic_rl.training.on_policy_config import OnPolicyConfig


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

    RENAMED_KEYS: ClassVar[dict[str, str]] = {
        "gamma": "gamma_per_turn (GRPO discounts per turn; PPO's loss.gamma_per_token per token)"
    }

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
    gamma_per_turn: Fraction = 1.0
    """γ, the discount per policy turn for the turn modes: G_t = sum_(k>=t) γ^(k-t)·r_k. An env_steps
    term with its own gamma has already discounted its rewards from the episode's start
    (gamma_s^k·r_k on turn k), so keep this at 1 with it (a second discount is refused)."""

    def __post_init__(self):
        if self.mode == "episode" and self.gamma_per_turn != 1.0:
            raise ValueError(
                f"advantage.gamma_per_turn={self.gamma_per_turn} is only used by the turn modes (advantage.mode is 'episode'); "
                "discount the episode reward in its reward term (env_steps' gamma), or set advantage.mode: turn_position"
            )


@dataclasses.dataclass
class GRPOLoopConfig(LoopConfig):
    """`agentic-rl grpo`'s loop: LoopConfig with this command's own defaults."""

    steps: NonNegativeInt = 50
    output_dir: str = "runs/grpo"


@dataclasses.dataclass
class GRPOConfig(OnPolicyConfig):
    """`agentic-rl grpo`: Group Relative Policy Optimization on agent episodes."""

    rollout: GRPORolloutConfig = dataclasses.field(default_factory=GRPORolloutConfig)
    """Sampling."""
    train: GRPOLoopConfig = dataclasses.field(default_factory=GRPOLoopConfig)
    """Loop, output and checkpoints."""
    backend: Literal["agentic_rl", "trl"] = "agentic_rl"
    """agentic_rl: this trainer; trl: the same envs and rewards through TRL's GRPOTrainer."""
    loss: GRPOLossConfig = dataclasses.field(default_factory=GRPOLossConfig)
    """The GRPO objective and its variants."""
    advantage: AdvantageConfig = dataclasses.field(default_factory=AdvantageConfig)
    """Advantage source."""
    guidance: GuidanceConfig = dataclasses.field(default_factory=GuidanceConfig)
    """Off-policy oracle demonstrations in groups that all fail (off by default)."""
    skip_zero_advantage: bool = True
    """With beta = 0, leave out of the forward/backward every episode whose advantages are all 0
    (e.g. a group whose G episodes earned the same reward): its loss and gradient are exactly 0,
    and the normalisers still count it, so the update is unchanged. No effect when beta > 0 or
    loss.entropy_coef > 0 (those terms have a gradient) or for loss_type bnpo (its normaliser
    depends on the micro-batch)."""

    def __post_init__(self) -> None:
        if self.loss.loss_type == "dr_grpo":  # its constant denominator is derived, never a key (DR_GRPO_DENOMINATOR)
            budget = min(self.rollout.max_turns * self.rollout.max_turn_tokens, self.rollout.max_episode_tokens)
            self.loss = dataclasses.replace(self.loss, max_completion_length=budget)
        super().__post_init__()
        if (
            self.backend == "agentic_rl"
        ):  # TRL places its model itself, from rollout.device (integrations/trl_backend.py)
            check_trainer_device(self.rollout.device)
        discounted = [
            spec.params["gamma"]
            for spec in self.rewards
            if spec.name == "env_steps" and spec.params.get("gamma", 1.0) != 1.0
        ]
        if self.advantage.gamma_per_turn != 1.0 and discounted:
            raise ValueError(
                f"advantage.gamma_per_turn={self.advantage.gamma_per_turn} with an env_steps term of gamma={discounted[0]}: the term already places "
                f"step k's reward on turn k as gamma^k·r_k, so a turn's return-to-go would discount it twice (G_0 would not be the "
                f"episode's reward). Keep advantage.gamma_per_turn: 1 (then G_t = sum_(k>=t) gamma^k·r_k, the discounted objective's "
                f"policy gradient), or move the discount from the term to advantage.gamma_per_turn"
            )

    def check(self) -> None:
        """Guidance replays the env's oracle: the env must have one (the validation step)."""
        if self.guidance.enabled and has_oracle(self.env.name) is False:
            raise no_oracle_error(self.env.name, "guidance.enabled", "set guidance.enabled: false")
