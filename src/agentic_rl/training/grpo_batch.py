"""The batches GRPO trains on: one rollout batch per μ updates, split into micro-batches.

Shapes: B_local episodes on this process (B = P·G over all processes), T tokens per padded row.
"""

from __future__ import annotations

import dataclasses

import torch

from agentic_rl.rollout.trajectory import Trajectory, TrajectoryBatch


@dataclasses.dataclass
class RolloutBatch:
    """This process's rows of one rollout batch, with everything the loss needs."""

    trajectories: list[Trajectory]
    """The B_local episodes, in global row order (groups whole, split by stride across processes)."""
    tensors: TrajectoryBatch
    """Collated ids, attention, loss mask and sampling log-probs: (B_local, T) each."""
    advantages: torch.Tensor | list[list[float]]
    """(B_local,) one per episode (advantage.mode episode), or per row its turns' values (mode turn)."""
    old_logprobs: torch.Tensor | None
    """(B_local, T) π_old; None: π_θ.detach() (old_logprobs: detach, exact on-policy)."""
    ref_logprobs: torch.Tensor | None
    """(B_local, T) π_ref, computed only when the loss needs a reference (β > 0)."""
    off_policy: torch.Tensor
    """(B_local,) bool: oracle demonstrations added by guidance (no π_old: their ratio is 1)."""
    weights_version: int
    """The weights that sampled the batch."""
    metrics: dict[str, float]
    """Rollout statistics, logged with the step that trains on the batch."""
    staleness: int = 0
    """Optimizer steps since the batch was sampled (0 for the first of its μ updates)."""


@dataclasses.dataclass
class MicroBatch:
    """Rows of a RolloutBatch that run one forward/backward together."""

    batch: RolloutBatch
    rows: list[int]
    """Row indices into the batch, in group order (a group's rows share their prompt)."""
    share: float
    """len(rows) / B_local: the weight of a per-sequence-mean loss (loss_type grpo, dr_grpo)."""
    tokens: float
    """Trained tokens of the whole local batch: the normaliser of loss_type dapo."""
