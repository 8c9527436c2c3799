"""`TokenScorer`: the module the training loop prepares (DDP/FSDP/DeepSpeed wrap it).

Its forward returns per-token log-probs via `sequence_logprobs` (LM head only on trained
positions). Going through this module's forward, rather than calling the backbone of an
unwrapped model, is what lets DDP hook the backward pass and all-reduce gradients.
"""

from __future__ import annotations

import torch

from agentic_rl.algorithms.logprobs import sequence_logprobs


class TokenScorer(torch.nn.Module):
    """Wraps a causal LM (optionally PEFT); forward -> (logps (B, T), entropy (B, T) | None)."""

    def __init__(self, policy: torch.nn.Module):
        super().__init__()
        self.policy = policy

    def forward(self, input_ids, attention_mask, loss_mask, temperature: float = 1.0, with_entropy: bool = False,
                entropy_grad: bool = False):
        return sequence_logprobs(self.policy, input_ids, attention_mask, loss_mask, temperature, with_entropy,
                                 entropy_grad=entropy_grad)


def unwrap_policy(model: torch.nn.Module, accelerator) -> torch.nn.Module:
    """The policy inside a prepared TokenScorer (or the model itself)."""
    inner = accelerator.unwrap_model(model)
    return inner.policy if isinstance(inner, TokenScorer) else inner
