"""Bradley-Terry reward-model loss: L = −E[log σ(r(x, y_w) − r(x, y_l))].

Shapes: N pairs. `chosen` and `rejected` are the scalar scores r(x, y) of each pair's sides.
log σ is computed as −softplus(−z), which is exact and does not overflow for large |z|.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def bradley_terry_loss(
    chosen: torch.Tensor, rejected: torch.Tensor, num_pairs: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, accuracy) for (N,) chosen and rejected scores.

    loss = Σ softplus(−(chosen − rejected)) / num_pairs  (num_pairs defaults to N: the mean)
    accuracy = share of pairs with chosen > rejected (ties count as wrong).
    """
    if chosen.shape != rejected.shape or chosen.dim() != 1:
        raise ValueError(f"chosen {tuple(chosen.shape)} and rejected {tuple(rejected.shape)} must both be (N,)")
    margin = chosen - rejected  # (N,)
    loss = F.softplus(-margin).sum() / (num_pairs if num_pairs is not None else margin.numel())  # ()
    accuracy = (margin.detach() > 0).float().mean()  # ()
    return loss, accuracy
