"""Per-token log-probabilities and entropies, computed without full-vocabulary float copies.

Shape legend (used in every comment below):
    B  sequences in the batch (= prompts * G for GRPO)
    T  tokens per (right-padded) sequence
    V  vocabulary size
    H  hidden size of the backbone
    N  number of scored positions (tokens whose loss_mask is 1), N <= B*T

Three levers on the cost of scoring live here (each measured in BENCHMARKS.md):

1. `token_logprobs` never materialises a second full (.., V) float tensor. The forward pass
   folds the logits into a logsumexp chunk by chunk of rows; the backward pass recomputes the
   softmax of each chunk from the saved logits and writes the gradient chunk by chunk. The
   only (.., V) tensors alive are the logits the caller passed in and, during backward, their
   gradient (which autograd needs anyway).
2. `sequence_logprobs` runs the backbone once and applies the LM head ONLY at the N positions
   whose next token is trained (loss_mask 1), so prompt, observation and padding positions
   never pay for a (H x V) projection.
3. `sequence_logprobs` runs a prefix that every row shares (the system prompt and tool schemas;
   the whole prompt when the rows are one GRPO group) through the backbone ONCE, for one row,
   and the rest of each row on top of its key/value cache, repeated over the batch. Autograd
   sums the rows' gradients through the repeat, so logps and gradients are those of the plain
   batched pass (to float rounding), for a fraction of the compute: agent prompts are long
   (~430 of ~600 tokens for SmolLM2 on arith) and every row repeats them.

How this departs from TRL 1.16 (`trl.trainer.utils.add_fused_lm_head`): TRL monkey-patches the
model's `forward` and chunks over the vocabulary with an online logsumexp (and Triton on GPU).
We patch nothing: we call the backbone (`get_decoder()`) and the output embeddings directly,
and chunk over rows. Results agree to float rounding (tests/test_grpo_vs_trl.py).
"""

from __future__ import annotations

import torch
from torch import nn

from agentic_rl.models.backbone import backbone_and_head, backbone_hidden, backbone_of, shared_prefix_length

_FLOATS_PER_CHUNK = 1 << 25  # ~128 MiB of float32 per row chunk: rows = max(1, this // V)


def _rows_per_chunk(vocab_size: int, rows_per_chunk: int | None) -> int:
    return rows_per_chunk if rows_per_chunk is not None else max(1, _FLOATS_PER_CHUNK // vocab_size)


class _ChunkedTokenLogprob(torch.autograd.Function):
    """logp[n] = z[n, y_n]/temp - logsumexp(z[n, :]/temp), saving only z and the (N,) logsumexp."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, temperature: float, rows: int) -> torch.Tensor:
        compute_dtype = torch.promote_types(logits.dtype, torch.float32)
        log_normalizer = torch.empty(logits.shape[0], dtype=compute_dtype, device=logits.device)  # (N,)
        target_logit = torch.empty_like(log_normalizer)  # (N,)
        for start in range(0, logits.shape[0], rows):
            scaled = logits[start : start + rows].to(compute_dtype) / temperature  # (n, V)
            log_normalizer[start : start + rows] = torch.logsumexp(scaled, dim=-1)  # (n,)
            target_logit[start : start + rows] = scaled.gather(-1, targets[start : start + rows, None])[:, 0]  # (n,)
        ctx.save_for_backward(logits, targets, log_normalizer)
        ctx.temperature, ctx.rows = temperature, rows
        return target_logit - log_normalizer  # (N,)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        logits, targets, log_normalizer = ctx.saved_tensors
        grad_logits = torch.empty_like(logits)  # (N, V) in the logits' own dtype
        for start in range(0, logits.shape[0], ctx.rows):
            stop = start + ctx.rows
            scaled = logits[start:stop].to(log_normalizer.dtype) / ctx.temperature  # (n, V)
            probs = scaled.sub_(log_normalizer[start:stop, None]).exp_()  # (n, V) softmax, reusing `scaled`
            # d logp / d z = (onehot(y) - softmax(z/temp)) / temp
            probs.neg_().scatter_add_(-1, targets[start:stop, None], torch.ones_like(probs[:, :1]))
            grad_logits[start:stop] = probs * (grad_out[start:stop, None] / ctx.temperature)
        return grad_logits, None, None, None


def token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, rows_per_chunk: int | None = None
) -> torch.Tensor:
    """log softmax(logits / temperature) gathered at `targets`, memory-efficiently.

    Args:
        logits: (..., V) any float dtype; the math runs in at least float32.
        targets: (...) long, the token whose log-probability is wanted at each position.
        temperature: the sampling temperature; logits are divided by it (must be > 0).
        rows_per_chunk: rows of V processed at once (default: ~128 MiB of float32).
    Returns:
        (...) log-probabilities, dtype float32 (float64 if the logits are float64).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 to define a distribution, got {temperature}")
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} must be targets {tuple(targets.shape)} plus a vocab dim")
    vocab_size = logits.shape[-1]
    flat_logits = logits.reshape(-1, vocab_size)  # (N, V), a view when contiguous
    flat_targets = targets.reshape(-1)  # (N,)
    rows = _rows_per_chunk(vocab_size, rows_per_chunk)
    return _ChunkedTokenLogprob.apply(flat_logits, flat_targets, float(temperature), rows).view(targets.shape)


def token_entropy(logits: torch.Tensor, temperature: float = 1.0, rows_per_chunk: int | None = None) -> torch.Tensor:
    """Entropy of softmax(logits / temperature) at each position, chunked over rows.

    H = logsumexp(z) - sum_v softmax(z)_v * z_v  (z = logits / temperature).
    Differentiable through plain autograd, so with grad enabled each chunk's float copy is kept
    for backward; use it under `torch.no_grad()` when it is only a metric.

    Args: logits (..., V). Returns: (...) float32 (float64 for float64 logits).
    """
    vocab_size = logits.shape[-1]
    flat_logits = logits.reshape(-1, vocab_size)  # (N, V)
    compute_dtype = torch.promote_types(logits.dtype, torch.float32)
    rows = _rows_per_chunk(vocab_size, rows_per_chunk)
    pieces = []
    for start in range(0, flat_logits.shape[0], rows):
        scaled = flat_logits[start : start + rows].to(compute_dtype) / temperature  # (n, V)
        log_normalizer = torch.logsumexp(scaled, dim=-1)  # (n,)
        probs = torch.softmax(scaled, dim=-1)  # (n, V)
        pieces.append(log_normalizer - (probs * scaled).sum(-1))  # (n,)
    if not pieces:
        return flat_logits.new_zeros(logits.shape[:-1], dtype=compute_dtype)
    return torch.cat(pieces).view(logits.shape[:-1])  # (...)


def sequence_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    loss_mask: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    share_prefix: bool = True,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of the trained tokens, running the LM head only where they are needed.

    out[b, t] = log p(input_ids[b, t] | input_ids[b, :t]) where loss_mask[b, t] == 1, else 0.

    Args:
        model: a transformers causal LM, optionally PEFT-wrapped (adapters stay active; to score
            under pi_ref with LoRA, call this inside `model.disable_adapter()`).
        input_ids: (B, T) long, right- or left-padded.
        attention_mask: (B, T) 1 on real tokens.
        loss_mask: (B, T) 1 on policy tokens. Column 0 must be 0: the first token has no context.
        temperature: the sampling temperature (logits are divided by it).
        with_entropy: also return the entropy of the next-token distribution at the same places
            (detached: a metric, not a loss term, unless entropy_grad).
        share_prefix: run the prefix shared by all rows once (see `shared_prefix_length`).
        entropy_grad: keep the entropy differentiable, for an entropy bonus in the loss (costs one
            more float copy of the (N, V) logits for backward).
    Returns:
        (logps (B, T), entropy (B, T) or None), float32 (float64 for a float64 model).
    """
    scored_hidden, scored = scored_hidden_states(model, input_ids, attention_mask, loss_mask, share_prefix)
    return logprobs_from_hidden(model, scored_hidden, scored, input_ids, temperature, with_entropy, entropy_grad)


def scored_hidden_states(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    loss_mask: torch.Tensor,
    share_prefix: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden (N, H), scored (B, T-1)): the backbone's last hidden state at every position whose
    NEXT token is trained, i.e. the state from which a policy token is sampled, and where those
    positions are (`scored[b, t-1]` is True iff token t of row b is trained). The LM head turns
    them into log-probs (`logprobs_from_hidden`); PPO's value head reads the same states."""
    if input_ids.shape != loss_mask.shape or input_ids.shape != attention_mask.shape:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)}, attention_mask {tuple(attention_mask.shape)} and loss_mask "
            f"{tuple(loss_mask.shape)} must all be (B, T)"
        )
    if bool(loss_mask[:, 0].any()):
        raise ValueError("loss_mask[:, 0] must be 0: the first token has no context to be predicted from")
    backbone = backbone_of(model)  # a causal LM, or a critic's bare decoder
    scored = loss_mask[:, 1:].bool()  # (B, T-1): position t-1 predicts token t, which is trained
    prefix = shared_prefix_length(input_ids, attention_mask, loss_mask) if share_prefix else 0
    hidden = backbone_hidden(backbone, input_ids, attention_mask, prefix)  # (B, T-P, H): positions P..T-1
    return hidden[:, :-1][scored[:, prefix:]], scored  # (N, H); no scored position lies before P


def logprobs_from_hidden(
    model: nn.Module,
    scored_hidden: torch.Tensor,
    scored: torch.Tensor,
    input_ids: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`sequence_logprobs`' second half: the LM head on the (N, H) states of `scored_hidden_states`."""
    _, head = backbone_and_head(model)
    targets = input_ids[:, 1:][scored]  # (N,)
    logits = head(scored_hidden)  # (N, V): the only full-vocabulary tensor of the forward pass
    logps = token_logprobs(logits, targets, temperature)  # (N,)
    out = scatter_rows(logps, scored)  # (B, T)
    if not with_entropy:
        return out, None
    if entropy_grad:
        return out, scatter_rows(token_entropy(logits, temperature), scored)  # (B, T), with grad
    with torch.no_grad():
        entropy = scatter_rows(token_entropy(logits.detach(), temperature), scored)  # (B, T)
    return out, entropy


def scatter_rows(values: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
    """Place (N,) values at the True entries of `scored` (B, T-1), shifted right by one -> (B, T)."""
    shifted = values.new_zeros(scored.shape).masked_scatter(scored, values)  # (B, T-1), differentiable
    return torch.cat([values.new_zeros(scored.shape[0], 1), shifted], dim=1)  # (B, T)
