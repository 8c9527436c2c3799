"""Gathering across processes in global row order. Episodes are split across ranks by stride
(training/sampler.py), so rank r holds global rows r, r + world, ...; these put every rank's
rows back in that order, so each rank computes exactly what one process would.
"""

from __future__ import annotations

from typing import Any

import torch
from accelerate.utils import gather_object


def gather_in_global_order(acc: Any, local: torch.Tensor) -> torch.Tensor:
    """(B, ...) every process's rows of `local` (B_local, ...), put back in global row order (the stride split)."""
    if acc.num_processes == 1:
        return local
    gathered = acc.gather(local.to(acc.device)).cpu()  # (B,) as [rank0 rows..., rank1 rows...]
    world, per_rank = acc.num_processes, local.shape[0]
    order = torch.empty_like(gathered)
    for rank in range(world):
        order[rank::world] = gathered[rank * per_rank : (rank + 1) * per_rank]
    return order  # (B,) in global row order


def gather_objects(acc: Any, local: list) -> list:
    """Every process's list entries, in global row order (the stride split)."""
    if acc.num_processes == 1:
        return local

    flat = gather_object([local])
    world = acc.num_processes
    out = [None] * sum(len(part) for part in flat)
    for rank, part in enumerate(flat):
        out[rank::world] = part
    return out


def combine_drift(acc: Any, total: float, count: int, largest: float) -> tuple[float, int, float]:
    """(sum, count, max) of the audit's log-prob drift over all processes."""
    if acc.num_processes == 1:
        return total, count, largest
    sums = acc.reduce(
        torch.tensor([total, float(count)], dtype=torch.float64, device=acc.device), reduction="sum"
    ).cpu()
    largest = float(acc.gather(torch.tensor([largest], dtype=torch.float64, device=acc.device)).max().cpu())
    return float(sums[0]), int(sums[1]), largest


def sum_over_processes(acc: Any, value: float) -> float:
    if acc.num_processes == 1:
        return value
    return float(acc.reduce(torch.tensor([value], dtype=torch.float64, device=acc.device), reduction="sum").cpu()[0])
