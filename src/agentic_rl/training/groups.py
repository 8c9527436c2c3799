"""Which groups a GRPO batch trains on: prompt selection by success-rate band, dynamic
sampling's bookkeeping, and guided groups (an oracle demonstration in a group that all failed).

A group whose G rewards are all equal has advantage 0 and no gradient: it costs a rollout and
teaches nothing. `PromptSelector` draws prompts (optionally only those whose success rate so far
lies in a band) and records every group's outcome; `guide` puts an oracle demonstration into each
group with no correct episode. The trainer (training/grpo.py) decides when to call them.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Callable

import torch

from agentic_rl.config import Config, NonNegativeInt, refuse_unused
from agentic_rl.rollout.demos import oracle_demos
from agentic_rl.rollout.trajectory import Trajectory


@dataclasses.dataclass
class SelectionConfig(Config):
    """Which groups a batch trains on (see the module docstring). Both levers are off by default."""

    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: replace zero-variance groups by groups of fresh prompts, rolled out
    in extra rounds, until every group of the batch has reward variance or `max_rounds` is spent;
    the groups still missing are filled with zero-variance ones (so the batch size never changes)."""
    max_rounds: NonNegativeInt = 2
    """Extra rollout rounds dynamic sampling may run per batch: the cap on its extra cost (each
    round rolls out only the missing groups)."""
    band: list[float] = dataclasses.field(default_factory=lambda: [0.0, 1.0])
    """[low, high]: a prompt is drawn again only while the share of its earlier episodes that were
    correct lies in [low, high] (a prompt never drawn before always qualifies). E.g. [0.05, 0.95]
    stops drawing prompts the policy always or never solves. [0, 1]: no filter. Works when prompts
    recur, i.e. with a task_pool of the order of steps x prompts per step."""

    def __post_init__(self) -> None:
        if not self.dynamic_sampling:
            refuse_unused(
                self,
                ["max_rounds"],
                prefix="selection.",
                used_with="selection.dynamic_sampling: true",
                now="selection.dynamic_sampling is false",
            )
        if len(self.band) != 2 or not 0.0 <= self.band[0] <= self.band[1] <= 1.0:
            raise ValueError(f"selection.band must be [low, high] with 0 <= low <= high <= 1, got {self.band}")


@dataclasses.dataclass
class GuidanceConfig(Config):
    """Guided groups (LUFFY, arXiv 2504.14945): off-policy demonstrations where on-policy RL fails."""

    enabled: bool = False
    """When no episode of a group is correct, the env's oracle demonstration of that prompt
    replaces the group's last episode, so the group has a correct member and a gradient. The
    demonstration was not sampled by the policy, so there is no π_old for its tokens: its
    ratio is π_θ / sg(π_θ) = 1 (no clipping), and its gradient is A · ∇log π_θ(demo), an
    advantage-weighted SFT step. (LUFFY shapes this with π/(π+γ); that is not implemented.)
    Needs an env with an oracle (arith, gsm8k)."""


@dataclasses.dataclass
class Group:
    """The G episodes of one prompt: this process's share of them, and the whole group's rewards."""

    task: Any
    local: list[Trajectory]
    """This process's episodes of the group (all G of them in a single process)."""
    rewards: torch.Tensor
    """(G,) total rewards of every episode of the group, in row order."""
    correct: int
    """Episodes of the group graded correct."""

    @property
    def has_variance(self) -> bool:
        return bool(self.rewards.max() != self.rewards.min())


class PromptSelector:
    """Draws a batch's prompts from the task pool; remembers how often each prompt was solved."""

    def __init__(self, task_pool: list[Any], cfg: SelectionConfig):
        self.task_pool = task_pool
        self.cfg = cfg
        self.outcomes: dict[str, tuple[int, int]] = {}  # task id -> (correct, episodes) over all batches so far
        self.band_fallbacks = 0  # draws where too few prompts lay in the band (the whole pool was used)

    def draw(self, rng: random.Random, prompts: int, exclude: set[str] = frozenset()) -> list[Any]:
        """`prompts` distinct tasks of the pool, none of `exclude` (already in this batch); with a
        band, only those whose success rate so far lies in it."""
        low, high = self.cfg.band
        pool = [t for t in self.task_pool if t.id not in exclude] if exclude else self.task_pool
        if (low, high) != (0.0, 1.0):
            in_band = [t for t in pool if self.in_band(t.id, low, high)]
            if len(in_band) < prompts:  # an exhausted band falls back to the whole pool, and says so
                self.band_fallbacks += 1
            else:
                pool = in_band
        if not exclude and len(pool) < prompts:
            raise ValueError(
                f"env.task_pool={len(self.task_pool)} tasks cannot give {prompts} distinct prompts per batch "
                "(rollout.batch_size / rollout.group_size); raise env.task_pool"
            )
        return rng.sample(pool, min(prompts, len(pool)))  # dynamic sampling takes what the pool has left

    def in_band(self, task_id: str, low: float, high: float) -> bool:
        correct, total = self.outcomes.get(task_id, (0, 0))
        return total == 0 or low <= correct / total <= high

    def record(self, group: Group) -> None:
        correct, total = self.outcomes.get(group.task.id, (0, 0))
        self.outcomes[group.task.id] = (correct + group.correct, total + len(group.rewards))


def guide(
    groups: list[Group],
    env_for: Callable[[Any], Any],
    chat_format: Any,
    composer: Callable[[list[Trajectory]], list[float]],
    weights_version: int,
    accelerator: Any,
) -> int:
    """LUFFY-style guidance (GuidanceConfig): an oracle demonstration replaces the last episode of
    each group with no correct episode, in place. Every process computes the demonstration's
    reward; the process that owns the group's last row (rows are split by stride) also keeps its
    tokens. Returns the number of groups guided."""
    guided = 0
    for group in groups:
        if group.correct > 0:
            continue
        demo = oracle_demos(env_for(group.task), [group.task], chat_format)[0]
        demo.weights_version = weights_version
        demo.finish_reason = "answered"
        demo.info["off_policy"] = True
        group.rewards[-1] = float(composer([demo])[0])
        group.correct += 1
        if (len(group.rewards) - 1) % accelerator.num_processes == accelerator.process_index:
            group.local[-1] = demo
        guided += 1
    return guided
