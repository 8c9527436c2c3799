"""Token sampling with the log-probabilities the trainer will recompute.

    tokens, logprobs = sample(logits, params, generators)     # logits (B, V) -> (B,), (B,)

Which log-probability is recorded (and why): `logprobs[b] = log_softmax(logits[b] / T)[token]`,
the temperature-scaled FULL distribution, even when top-p / top-k truncate what is sampled
from. The GRPO trainer recomputes log pi(token) with one forward pass and log_softmax(logits / T);
it never re-applies the truncation, so recording the truncated log-prob would make the
"old" and "new" policies disagree at step 0 (ratio != 1). The price: top-p/top-k sampling is
slightly off-policy with respect to the recorded distribution; with top_p = 1 and top_k = 0
(the defaults) the two are identical. Greedy decoding (greedy=True or temperature == 0)
records the T = 1 log-probabilities.

Randomness: one CPU `torch.Generator` per row (one per episode in the engine), each drawing one
uniform number per sampled token, moved to the logits' device, then inverse-CDF sampling. An episode's random stream
therefore does not depend on which other episodes share the batch, and the same seed gives
the same tokens. Shapes: B rows, V vocabulary.
"""

from __future__ import annotations

from typing import Sequence

import torch

from agentic_rl.rollout.config import SamplingParams  # noqa: F401  (defined torch-free, with the configs)


def make_generator(seed: int, stream: int) -> torch.Generator:
    """A CPU generator for one episode: a fixed function of (seed, stream)."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed((seed * 1_000_003 + stream * 7_919 + 12_345) % (2**63 - 1))
    return generator


def sample(
    logits: torch.Tensor, params: SamplingParams, generators: torch.Generator | Sequence[torch.Generator] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row. logits (B, V) -> tokens (B,) long, logprobs (B,) float32.

    `generators`: one per row (deterministic per row), or a single one drawn in row order.
    """
    logits = logits.float()  # (B, V)
    batch = logits.shape[0]
    if params.is_greedy:
        best, tokens = logits.max(dim=-1)  # (B,), (B,)
        return tokens, best - torch.logsumexp(logits, dim=-1)  # log_softmax at T = 1, no (B, V) temporary
    logprobs_full = torch.log_softmax(logits / params.temperature, dim=-1)  # (B, V)
    if generators is None or isinstance(generators, torch.Generator):
        uniforms = torch.rand(batch, generator=generators)  # (B,)
    else:
        assert len(generators) == batch, f"{len(generators)} generators for {batch} rows"
        uniforms = torch.cat([torch.rand(1, generator=g) for g in generators])  # (B,)
    uniforms = uniforms.to(logits.device)  # drawn on the CPU generators, so a seed gives the same draws on any device
    probs = logprobs_full.exp()  # (B, V)
    if params.top_k > 0 or params.top_p < 1.0:
        tokens = _sample_truncated(probs, params, uniforms)
    else:
        cumulative = probs.cumsum(dim=-1)  # (B, V)
        targets = uniforms[:, None] * cumulative[:, -1:]  # (B, 1): scale, cumsum may end at 1 - eps
        tokens = torch.searchsorted(cumulative, targets, right=True).squeeze(1)  # (B,)
        tokens = tokens.clamp_(max=probs.shape[-1] - 1)
    return tokens, logprobs_full.gather(1, tokens[:, None]).squeeze(1)


def _sample_truncated(probs: torch.Tensor, params: SamplingParams, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling from the top-k / top-p renormalised distribution. probs (B, V) -> (B,)."""
    sorted_probs, sorted_ids = probs.sort(dim=-1, descending=True)  # (B, V)
    if params.top_k > 0:
        sorted_probs[:, params.top_k :] = 0.0
    if params.top_p < 1.0:
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # (B, V): mass strictly before each token
        sorted_probs = sorted_probs.masked_fill(before >= params.top_p, 0.0)  # the top token always stays
    cumulative = sorted_probs.cumsum(dim=-1)  # (B, V)
    targets = uniforms[:, None] * cumulative[:, -1:]  # (B, 1)
    picks = torch.searchsorted(cumulative, targets, right=True).clamp_(max=probs.shape[-1] - 1)  # (B, 1)
    return sorted_ids.gather(1, picks).squeeze(1)
