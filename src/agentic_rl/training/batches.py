"""The batches GRPO and PPO train on: one rollout batch per μ updates, split into micro-batches.
A batch being reused across μ > 1 updates is checkpointed (training/checkpoint.py allows these types).

Shapes: B_local episodes on this process (B = P·G over all processes), R_local rows (token
sequences: R_local = B_local unless an env changes the context, training/episodes.py), T tokens
per padded row.
"""

from __future__ import annotations

import dataclasses

import torch

from agentic_rl.rollout.trajectory import Trajectory, TrajectoryBatch


@dataclasses.dataclass
class RolloutBatch:
    """This process's rows of one rollout batch, with everything the loss needs."""

    trajectories: list[Trajectory]
    """The R_local rows' token sequences, episodes in global row order (groups whole, split by
    stride across processes), an episode's sequences oldest first."""
    tensors: TrajectoryBatch
    """Collated ids, attention, loss mask and sampling log-probs: (R_local, T) each."""
    advantages: torch.Tensor
    """(R_local, T) each row's advantage per token (GRPO.advantages): its episode's on every token
    (advantage.mode episode), or the values of the turns it holds on their tokens (turn and
    turn_position; 0 between turns)."""
    old_logprobs: torch.Tensor | None
    """(R_local, T) π_old; None: π_θ.detach() (old_logprobs: detach, exact on-policy). With
    old_logprobs: recompute it starts at 0 and, after the batch's first update, holds the rows that
    update trained from its own forward pass (GRPO.keep_first_forward); no other row is ever read."""
    ref_logprobs: torch.Tensor | None
    """(R_local, T) π_ref, computed only when the loss needs a reference (β > 0)."""
    off_policy: torch.Tensor
    """(R_local,) bool: oracle demonstrations added by guidance (no π_old: their ratio is 1)."""
    weights_version: int
    """The weights that sampled the batch."""
    metrics: dict[str, float]
    """Rollout statistics, logged with the step that trains on the batch."""
    staleness: int = 0
    """Optimizer steps since the batch was sampled (0 for the first of its μ updates)."""
    episodes: int = 0
    """B_local: the episodes the rows come from (the "per sequence" normaliser of loss_type grpo
    and dr_grpo counts episodes, so an episode of several sequences counts once)."""
    row_weights: torch.Tensor | None = None
    """(R_local,) each row's share of its episode's policy tokens (1 for an episode of one
    sequence): the weight of the row's per-sequence mean in loss_type grpo."""


@dataclasses.dataclass
class MicroBatch:
    """Rows of a RolloutBatch that run one forward/backward together."""

    batch: RolloutBatch
    rows: list[int]
    """Row indices into the batch, in group order (a group's rows share their prompt)."""
    share: float
    """len(rows) / B_local (episodes): the weight of a per-sequence-mean loss (loss_type grpo, dr_grpo)."""
    tokens: float
    """Trained tokens of the whole local batch: the normaliser of loss_type dapo."""
    dummy: bool = False
    """A padding micro-batch (its loss times 0): under DDP every rank must run as many backward
    passes, and non-prefix episodes can leave ranks with different numbers of rows."""
    logprobs: torch.Tensor | None = None
    """(b, t) π_θ's log-probs of the rows from the forward that trained them (the loss's output,
    detached; t = the rows' longest length): a batch's first update keeps them (keep_first_forward)."""


@dataclasses.dataclass
class PPOBatch:
    """This process's rows of one rollout batch, with everything PPO's loss needs. (R_local, T) tensors:
    one row per token sequence (one per episode unless an env changes the context)."""

    trajectories: list[Trajectory]
    tensors: TrajectoryBatch
    old_logprobs: torch.Tensor | None
    """π_old; None: π_θ.detach() (old_logprobs: detach)."""
    ref_logprobs: torch.Tensor | None
    """π_ref, for kl_mode: loss with β > 0 only."""
    old_values: torch.Tensor
    """V at sampling time: GAE's baseline and the value clip's anchor."""
    advantages: torch.Tensor
    """GAE advantages (whitened when loss.whiten_advantages), 0 off the policy tokens."""
    returns: torch.Tensor
    """Value targets R = A + V_old (before whitening), 0 off the policy tokens."""
    tokens: float
    """The loss's normaliser: the policy tokens of the whole batch over the number of processes."""
    weights_version: int
    metrics: dict[str, float]
    staleness: int = 0


@dataclasses.dataclass
class PPOMicroBatch:
    batch: PPOBatch
    rows: list[int]
    dummy: bool = False
    """DDP padding (its loss times 0; see MicroBatch.dummy)."""
    logprobs: torch.Tensor | None = None
    """(b, t) π_θ's log-probs from the forward that trained the rows (see MicroBatch.logprobs)."""
