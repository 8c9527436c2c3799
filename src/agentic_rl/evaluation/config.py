"""What an evaluation runs: `EvalConfig` (the pipeline's `evals[]` entries), `EvalCommandConfig`
(`agentic-rl eval`, whose flags override its keys) and `AuditConfig` (`agentic-rl audit`).
Torch-free, so the CLI's help is instant."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

from agentic_rl.config import Config, PositiveFloat, PositiveInt, refuse_unused, require_model
from agentic_rl.envs.base import EnvSpec, has_oracle, no_oracle_error
from agentic_rl.plugins import PluginsConfig
from agentic_rl.rollout.config import FLOAT32_LOGPROB_TOLERANCE, RolloutConfig, RolloutDtype


@dataclasses.dataclass
class EvalConfig(Config):
    """One evaluation: which problems, how many samples, how episodes are decoded."""

    RENAMED_KEYS: ClassVar[dict[str, str]] = {"batch_size": "max_concurrent (episodes decoded at once)"}

    label: str = ""
    """Name of this evaluation in reports (default: the env name)."""
    env: EnvSpec = dataclasses.field(default_factory=EnvSpec)
    """The environment and its options (e.g. {name: arith, options: {difficulty: 2, templates: [train]}})."""
    split: Literal["train", "test"] = "test"
    """Task split."""
    n: PositiveInt = 48
    """Problems."""
    k: PositiveInt = 1
    """Samples per problem for pass@k / maj@k, at rollout.sampling.temperature (1: greedy pass@1 only)."""
    seed: int = 0
    """Task and sampling seed."""
    max_concurrent: PositiveInt = 16
    """Episodes decoded at once (the engine's slots: memory grows with it). The same name as serve's."""
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    """Limits, sampling temperature (for the k samples; pass@1 is greedy), backend and dtype."""
    failures_shown: int = 3
    """Failed transcripts kept in the result."""

    def __post_init__(self) -> None:
        if self.k == 1:  # pass@1 decodes greedily: the sampling settings are only for the k samples
            refuse_unused(
                self.rollout, ["sampling"], prefix="rollout.", used_with="k > 1", now="k is 1: pass@1 decodes greedily"
            )

    @property
    def name(self) -> str:
        return self.label or self.env.name


@dataclasses.dataclass
class EvalCommandConfig(EvalConfig, PluginsConfig):
    """`agentic-rl eval`: one evaluation of one model. Flags such as `--n 100` override these keys."""

    model: str = ""
    """Built-in name, HF directory, hub id, or a stage's final/ folder."""
    out: str = ""
    """Also write the whole result, with per-problem outcomes, to this JSON file (for `agentic-rl compare`)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require_model(self.model)


@dataclasses.dataclass
class AuditRolloutConfig(RolloutConfig):
    """`agentic-rl audit`'s rollout: RolloutConfig with short episodes (the checks need few tokens)."""

    max_turn_tokens: PositiveInt = 64
    max_turns: PositiveInt = 4


@dataclasses.dataclass
class AuditConfig(PluginsConfig):
    """`agentic-rl audit`: checks that training sees what inference sees (evaluation/audit.py)."""

    model: str = ""
    """Built-in name, HF directory, hub id, or a stage's final/ folder."""
    env: EnvSpec = dataclasses.field(default_factory=EnvSpec)
    """The environment whose episodes are sampled and whose oracle conversations are rendered."""
    split: Literal["train", "test"] = "test"
    """Task split."""
    n: PositiveInt = 8
    """Episodes per check (oracle conversations for the template, sampled episodes per dtype)."""
    seed: int = 0
    """Task and sampling seed."""
    rollout: AuditRolloutConfig = dataclasses.field(default_factory=AuditRolloutConfig)
    """How episodes are sampled (temperature 1 by default: the log-prob check needs sampled tokens)."""
    dtypes: list[RolloutDtype] = dataclasses.field(default_factory=lambda: ["float32", "auto"])
    """Decode precisions whose sampler log-probs are compared with the fp32 training forward
    (bfloat16 needs the fast backend: Llama and Qwen3 models). auto: bfloat16 where this machine
    runs bf16 fast, else float32 (models/precision.py); a dtype listed twice is checked once."""
    tolerance: PositiveFloat = FLOAT32_LOGPROB_TOLERANCE
    """Largest allowed |sampler − trainer| log-prob gap for float32 decoding (nats per token)."""

    def __post_init__(self) -> None:
        require_model(self.model)
        if not self.dtypes:
            raise ValueError(f"dtypes must be a non-empty list of float32, bfloat16 and auto, got {self.dtypes}")

    def check(self) -> None:
        """The audit replays the env's oracle: the env must have one (the validation step)."""
        if has_oracle(self.env.name) is False:
            raise no_oracle_error(
                self.env.name,
                "audit",
                "audit replays oracle episodes to check the chat template; run `agentic-rl eval` to check the env instead",
            )
