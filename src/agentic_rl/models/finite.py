"""Finite or fail: the one check that a model's weights hold numbers, for training (after every
optimizer step, and on resume) and for every stage output a command loads (eval, merge, serve,
chat, the pipeline's next stage), so NaN weights never leave a run as a model or a score."""

from __future__ import annotations

import torch

NORM_OVERFLOW = "(the norm of the weights)"
"""`first_non_finite`'s answer when every weight is finite but a tensor's norm overflows (|w| ~ 1e19
in float32): a diverged model all the same."""


def first_non_finite(model: torch.nn.Module, trainable_only: bool = True) -> str | None:
    """The name of the first non-finite parameter, NORM_OVERFLOW if only a norm overflows, else
    None. One fused pass (a norm per tensor), then a scan only when something is wrong."""
    params = [(name, p) for name, p in model.named_parameters() if p.requires_grad or not trainable_only]
    if not params:
        return None
    norms = torch._foreach_norm([p.detach() for _, p in params])  # one kernel per dtype/device group
    if bool(torch.isfinite(torch.stack([n.float() for n in norms])).all()):
        return None
    for name, param in params:
        if not bool(torch.isfinite(param.detach()).all()):
            return name
    return NORM_OVERFLOW
