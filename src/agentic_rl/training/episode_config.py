"""The config sections every on-policy RL trainer shares (GRPO and PPO): where episodes run, how
a rollout batch is shaped, and the optional reward-model term. One declaration, one set of
defaults; `grpo_config.py` and `ppo_config.py` embed them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from agentic_rl.config import Config, NonNegativeFloat, PositiveFloat, PositiveInt
from agentic_rl.envs.base import Env, EnvSpec, Task, make_env
from agentic_rl.models.precision import decoded_dtype
from agentic_rl.rollout.config import RolloutConfig


@dataclasses.dataclass
class EnvMixPart(Config):
    """One part of a task mix: the options it changes, and its share of the task pool."""

    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Options laid over env.options for this part's tasks and for the envs that run them."""
    share: PositiveFloat = 1.0
    """This part's weight: the pool is split in proportion to the shares (largest remainders)."""


@dataclasses.dataclass
class EnvConfig(EnvSpec):
    """The environment episodes run in, and the train-split tasks prompts are drawn from."""

    task_pool: PositiveInt = 2000
    """Train-split tasks to draw prompts from."""
    mix: list[EnvMixPart] = dataclasses.field(default_factory=list)
    """A task mix, e.g. plan's one- and two-door houses in one run: `[{options: {difficulty: 1,
    max_turns: 12}, share: 0.5}, {options: {difficulty: 2, max_turns: 16}, share: 0.5}]`. Part k
    contributes its share of task_pool (train split, drawn with train.seed; ids prefixed `mix<k>:`),
    and each episode runs in an env made with env.options updated by its task's part. Prompts are
    sampled from the whole pool, so a batch holds each part in proportion only on average; the
    rollout limits (rollout.max_turns, max_episode_tokens) must fit the largest part. Every part
    must offer the same tools. Empty: every task from env.options."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mix and min(self.part_sizes()) == 0:
            raise ValueError(
                f"env.task_pool={self.task_pool} gives env.mix parts of {self.part_sizes()} tasks; "
                "raise task_pool or the small shares, so that every part has tasks"
            )

    def check(self) -> None:
        """The env built from its options, and each mix part's (the validation step)."""
        super().check()
        tools = None
        for k, options in enumerate(self.part_options()):
            try:
                schemas = make_env(self.name, **options).tool_schemas
            except ValueError as exc:
                raise ValueError(f"env.mix[{k}]: {exc}") from None
            if tools is not None and schemas != tools:
                raise ValueError(
                    f"env.mix[{k}] offers other tools than env.mix[0]; every part of a mix must offer the "
                    "same tools (one system prompt and tool schema per run)"
                )
            tools = schemas

    def part_options(self) -> list[dict[str, Any]]:
        """Each mix part's env options: env.options updated by the part's."""
        return [{**self.options, **part.options} for part in self.mix]

    def part_sizes(self) -> list[int]:
        """Tasks each mix part contributes: task_pool split by share, remainders to the largest fractions."""
        total = sum(part.share for part in self.mix)
        exact = [self.task_pool * part.share / total for part in self.mix]
        sizes = [int(value) for value in exact]
        by_fraction = sorted(range(len(exact)), key=lambda k: sizes[k] - exact[k])  # largest fraction first, stable
        for k in by_fraction[: self.task_pool - sum(sizes)]:
            sizes[k] += 1
        return sizes

    def train_tasks(self, seed: int) -> list[Task]:
        """The task pool: task_pool train-split tasks of env.options, or of each mix part in turn."""
        if not self.mix:
            return self.make().tasks("train", n=self.task_pool, seed=seed)
        return [
            dataclasses.replace(task, id=f"mix{k}:{task.id}", meta={**task.meta, "mix_part": k})
            for k, (options, size) in enumerate(zip(self.part_options(), self.part_sizes()))
            for task in make_env(self.name, **options).tasks("train", n=size, seed=seed)
        ]

    def reward_terms(self) -> list[str]:
        """The named parts of the env's reward its episodes report (`Env.reward_terms`), over every mix part."""
        envs = [make_env(self.name, **options) for options in self.part_options()] if self.mix else [self.make()]
        return list(dict.fromkeys(name for env in envs for name in env.reward_terms))

    def env_for(self, task: Task) -> Env:
        """A fresh env to run `task` in: its mix part's, or env.options' without a mix."""
        if not self.mix:
            return self.make()
        return make_env(self.name, **self.part_options()[task.meta["mix_part"]])


@dataclasses.dataclass
class BatchRolloutConfig(RolloutConfig):
    """How episodes are sampled (every RolloutConfig key) and the batch shape."""

    batch_size: PositiveInt = 8
    """Episodes per rollout batch, over all processes: prompts × group_size."""
    group_size: PositiveInt = 4
    """G: episodes per prompt. Must divide batch_size."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.batch_size % self.group_size:
            raise ValueError(
                f"rollout.batch_size={self.batch_size} is not a multiple of rollout.group_size={self.group_size}. "
                "The G episodes of a prompt stay together in one batch (GRPO compares them with each other: "
                "advantage = reward − group mean), so a batch is P whole groups: batch_size = prompts × G. "
                f"Use batch_size={_nearest_multiples(self.batch_size, self.group_size)}."
            )
        if self.sampling.temperature <= 0:
            raise ValueError(
                "rollout.sampling.temperature must be > 0 for on-policy RL: the policy must sample, and its "
                "log-probs must be those of a distribution"
            )


@dataclasses.dataclass
class RewardModelTerm(Config):
    """An optional learned reward term."""

    path: str = ""
    """A reward model folder from `agentic-rl rm` (empty: no reward-model term). The pipeline sets it
    to its rm stage's model: there, set only the weight."""
    weight: NonNegativeFloat = 0.0
    """Its weight in the total reward (0: no reward-model term)."""

    def check_path(self) -> None:
        """A weight needs a folder to score with (the commands that train on their own; the pipeline
        supplies its rm stage's)."""
        if self.weight and not self.path:
            raise ValueError(
                "reward_model.weight is set but reward_model.path is empty; give the folder from `agentic-rl rm`"
            )


@dataclasses.dataclass
class StartAuditConfig(Config):
    """The checks of `agentic-rl audit`, run on each run's first batch (training/start_audit.py)."""

    on_start: bool = True
    """Before a run (or a resumed run) trains on its first batch, check that batch's own episodes,
    with no extra rollout or forward pass: earlier turns stay a token prefix when the conversation
    is rendered one turn further, and the loss mask is exactly the model's turns (a failure stops
    the run, naming the first bad token); the sampler's log-probs against the first update's own
    forward are logged (rollout/logprob_drift_max, _mean; above 1e-3 with float32 on both sides: a
    warning). Its cost is logged as time/audit (under 1% of the demo's GRPO step). false: skip it
    (backend trl never runs it: TRL builds its own batches)."""


OldLogprobs = Literal["sampling", "recompute", "detach"]


def check_old_logprobs(old_logprobs: str, updates_per_batch: int, rollout_dtype: str, model_dtype: str) -> None:
    """The π_old choice against μ and the decode precision (GRPO and PPO alike)."""
    if old_logprobs == "detach" and updates_per_batch > 1:
        raise ValueError(
            "old_logprobs=detach pins the ratio at 1, which is only right for the first update; "
            "with updates_per_batch > 1 use sampling or recompute"
        )
    decodes = decoded_dtype(rollout_dtype)
    if decodes != model_dtype and old_logprobs == "sampling":
        named = rollout_dtype if decodes == rollout_dtype else f"{rollout_dtype} ({decodes} on this machine)"
        raise ValueError(
            f"rollout.dtype={named} samples with other weights than the trained "
            f"{model_dtype} model, so its log-probs are not π_old; set old_logprobs: detach (μ = 1) "
            f"or recompute, or rollout.dtype: {model_dtype}"
        )


def check_trainer_device(device: str) -> None:
    """Our trainers decode with the model they train, which accelerate places (the GPU of each
    process when there is one, else the CPU): a rollout.device other than auto would be ignored."""
    if device != "auto":
        raise ValueError(
            f"rollout.device={device}: the trainer decodes with the model it trains, on accelerate's device "
            "(each process's GPU when there is one, else the CPU); leave rollout.device: auto, and pick "
            "GPUs with CUDA_VISIBLE_DEVICES (empty: the CPU) or the accelerate launch"
        )


def _nearest_multiples(value: int, step: int) -> str:
    """The multiples of `step` either side of `value` ("8 or 12" for 10 and 4), or `step` alone when `value` is below it."""
    below, above = step * (value // step), step * (value // step + 1)
    return f"{below} or {above}" if below else f"{above}"
