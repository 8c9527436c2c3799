"""Supervised fine-tuning loss: L = −Σ log P(y_i | x_i; θ) over policy tokens only.

Shapes: B sequences, T tokens. Only loss-masked tokens (what the assistant produces) count;
prompt and observation tokens get no gradient.

The sum is divided by `num_tokens`, the number of trained tokens of the whole optimizer step
(all micro-batches, all ranks), so accumulation and data parallelism give exactly the gradient
of the per-token mean over the full batch.
"""

from __future__ import annotations

import torch


def sft_loss(logps: torch.Tensor, loss_mask: torch.Tensor, num_tokens: float | torch.Tensor) -> torch.Tensor:
    """−Σ_masked logps / num_tokens.

    Args:
        logps: (B, T) log p of each token given its prefix (0 where not trained).
        loss_mask: (B, T) 1 on trained tokens.
        num_tokens: the normaliser, usually the trained-token count of the full batch.
    """
    if float(num_tokens) <= 0:
        raise ValueError("sft_loss: num_tokens must be > 0 (the batch has no trained tokens)")
    return -(logps * loss_mask.to(logps.dtype)).sum() / num_tokens  # ()
