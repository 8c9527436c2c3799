"""What an evaluation runs: `EvalConfig` (the pipeline's `evals[]` entries) and `EvalCommandConfig`
(`agentic-rl eval`, whose flags override its keys). Torch-free, so the CLI's help is instant."""

from __future__ import annotations

import dataclasses
from typing import Literal

from agentic_rl.config import PositiveInt
from agentic_rl.envs.base import EnvSpec
from agentic_rl.rollout.config import RolloutConfig


@dataclasses.dataclass
class EvalConfig:
    """One evaluation: which problems, how many samples, how episodes are decoded."""

    label: str = ""
    """Name of this evaluation in reports (default: the env name)."""
    env: EnvSpec = dataclasses.field(default_factory=EnvSpec)
    """The environment and its options (e.g. {name: arith, options: {difficulty: 2, templates: [train]}})."""
    split: Literal["train", "test"] = "test"
    """Task split."""
    n: PositiveInt = 48
    """Problems."""
    k: PositiveInt = 1
    """Samples per problem for pass@k / maj@k, at rollout.temperature (1: greedy pass@1 only)."""
    seed: int = 0
    """Task and sampling seed."""
    batch_size: PositiveInt = 16
    """Episodes decoded concurrently."""
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    """Limits, sampling temperature (for the k samples; pass@1 is greedy), backend and dtype."""
    failures_shown: int = 3
    """Failed transcripts kept in the result."""

    @property
    def name(self) -> str:
        return self.label or self.env.name


@dataclasses.dataclass
class EvalCommandConfig(EvalConfig):
    """`agentic-rl eval`: one evaluation of one model. Flags such as `--n 100` override these keys."""

    model: str = ""
    """Built-in name, HF directory, hub id, or a stage's final/ folder."""
    out: str = ""
    """Also write the whole result, with per-problem outcomes, to this JSON file (for `agentic-rl compare`)."""

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model is required: --model NAME (a built-in name, a folder, a hub id or a stage's final/)")
