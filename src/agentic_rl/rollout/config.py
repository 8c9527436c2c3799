"""`RolloutConfig`: how episodes are decoded. The one declaration of the rollout settings, of their
`sampling` section and of the engine's `SamplingParams`, which adds a seed to it (torch-free here,
so configs validate and `--help` formats without torch).

GRPO (`grpo.rollout`, which adds its batch shape), evaluation (`eval.rollout`, pipeline
`evals[].rollout`) and sampled reward-model pairs (`rm.pairs.rollout`) embed it, and
`build_engine(model, tokenizer, cfg, seed=...)` turns it into a RolloutEngine. How many episodes
decode at once is the caller's (a GRPO batch, an evaluation's or the server's max_concurrent), not a
rollout setting.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, ClassVar, Literal

from agentic_rl.config import Config, DeviceSetting, Interval, NonNegativeFloat, NonNegativeInt, PositiveInt

BackendKind = Literal["auto", "fast", "hf"]
RolloutDtype = Literal["float32", "bfloat16", "auto"]
FLOAT32_LOGPROB_TOLERANCE = 1e-3
"""Largest |sampler − trainer| log-prob gap (nats per token) where both sides decode and score in
float32: the sampler's kernels and the trainer's forward then differ by float rounding only. With a
bf16 side the gap is the sampler/trainer mismatch that `rollout_correction` corrects, not a bug.
`agentic-rl audit` and the audit on start of every GRPO/PPO run (rollout/episode_checks.py) use it."""


@dataclasses.dataclass(frozen=True)
class Sampling(Config):
    """How the policy samples a token: a rollout section's `sampling` (the one declaration of these
    settings; the engine's `SamplingParams` adds the seed)."""

    temperature: NonNegativeFloat = 1.0
    """Softmax temperature (0: greedy). Recorded log-probs use log_softmax(logits / T), and trainers
    score tokens at the same T. An evaluation decodes pass@1 greedily and uses this for its k samples."""
    top_p: Annotated[float, Interval("(0, 1]")] = 1.0
    """Nucleus sampling: keep the smallest set of tokens with cumulative probability >= top_p (1: off)."""
    top_k: NonNegativeInt = 0
    """Keep only the k most likely tokens (0: off)."""


@dataclasses.dataclass(frozen=True)
class SamplingParams(Sampling):
    """What the engine samples with: a `Sampling` plus the run's choices (frozen and hashable: the
    backend decodes the rows that share one together)."""

    greedy: bool = False
    """Take the argmax (same as temperature 0). Recorded log-probs are then at T = 1."""
    seed: int = 0
    """Base seed; the engine derives one generator per episode from it."""

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0


@dataclasses.dataclass
class TemplateOptions(Config):
    """How the chat template renders conversations (models/chat_format.py). Every rollout section
    and `sft` carry it, so demonstrations and episodes render alike."""

    enable_thinking: bool | None = dataclasses.field(default=None, kw_only=True)
    """The chat template's thinking switch (Qwen3). null: the template's own default (Qwen3:
    thinking, the model opens `<think>` itself); false: no thinking (Qwen3 writes an empty
    `<think></think>` block after each generation prompt); true: thinking. A template without
    the switch (SmolLM2) refuses true/false. Keep it equal across the stages of one model."""


@dataclasses.dataclass
class RolloutConfig(TemplateOptions):
    """Episode limits, sampling and the decode backend."""

    RENAMED_KEYS: ClassVar[dict[str, str]] = {key: f"sampling.{key}" for key in ("temperature", "top_p", "top_k")}

    max_turn_tokens: PositiveInt = 128
    """Token limit of one policy turn (including its stop token)."""
    max_episode_tokens: PositiveInt = 1024
    """Token limit of a whole episode: prompt, policy turns and observations."""
    max_turns: PositiveInt = 6
    """Policy turns per episode (the env's own max_turns also applies: the smaller wins)."""
    sampling: Sampling = dataclasses.field(default_factory=Sampling)
    """How tokens are sampled: {temperature, top_p, top_k}."""
    backend: BackendKind = "auto"
    """Decode backend (the contract: rollout/backend.py): fast (our decode path for Llama and
    Qwen3 models), hf (transformers' forward, the reference; any causal LM), auto (fast when the
    model is supported, else hf)."""
    dtype: RolloutDtype = "float32"
    """Decode precision (fast backend). bfloat16 decodes from bf16 copies of the weights: faster on
    CPUs with bf16 kernels (AVX512, AMX), far slower on AVX2-only ones (BENCHMARKS.md); its sampling
    log-probs differ from a float32 model's, so a trainer must not use them as π_old (GRPO:
    old_logprobs detach or recompute). auto: bfloat16 where bf16 is fast, else float32
    (models/precision.py); the run logs which."""
    tool_workers: PositiveInt = 4
    """Threads running the tool calls of different episodes in parallel."""
    device: DeviceSetting = "auto"
    """Where the model decodes: auto (the GPU when torch sees one, else the CPU), cpu, cuda or cuda:N.
    eval, chat, audit, serve, the pipeline's evals, the RM's sampled pairs and the TRL backend load
    the model there (models/device.py); dtype's auto rule is then that device's. The trainers
    (grpo, ppo) decode with the model they train, on accelerate's device, so there it stays auto."""

    def sampling_params(self, seed: int, temperature: float | None = None) -> SamplingParams:
        """The engine's sampling parameters (`temperature` overrides this config's, e.g. 0 for greedy)."""
        chosen = self.sampling if temperature is None else dataclasses.replace(self.sampling, temperature=temperature)
        return SamplingParams(**dataclasses.asdict(chosen), seed=seed)
