"""Sampler/trainer mismatch: importance weights that correct it, and statistics that measure it.
Pure tensor code, no I/O, no model.

Shape legend: B sequences (rows), T tokens per right-padded row; mask (B, T) is 1 on the tokens
the loss trains (policy tokens), 0 on prompt, observation and padding tokens.

Why. A rollout may be decoded by other numerics than the trainer's: bf16 weight copies
(`rollout.dtype: bfloat16`, or auto on a machine with fast bf16) against fp32 training, a bf16
autocast trainer against fp32 decoding, or tomorrow int8 or a serving engine. `old_logprobs:
recompute` (or detach) makes π_old the training precision's log-probs, so the PPO ratio π_θ/π_old
is right; but the tokens were still SAMPLED from π_sampler ≠ π_old, so the surrogate is an
estimate under the wrong distribution. The importance weight per trained token

    w_t = π_old(a_t | s_t) / π_sampler(a_t | s_t) = exp(log π_old − log π_sampler)

reweights each token to π_old's distribution (Yao et al. 2025, "Your efficient RL framework
secretly brings you off-policy RL training": TIS; the masked form is their MIS and IcePop's).

    w_seq = exp(mean over the row's trained tokens of (log π_old − log π_sampler))   level: sequence

At sequence level the weight is the GEOMETRIC MEAN of the row's token weights, not their product.
The product is the exact sequence likelihood ratio, but its log is a sum over ~100-1000 tokens:
a per-token bf16 gap of ±0.05 nats gives products anywhere in e^±5, so a fixed cap or band would
truncate or mask long rows for their length alone, and its variance grows exponentially with it.
The geometric mean is length-normalised (the same choice as GSPO's sequence ratio in
algorithms/grpo.py), so one cap means the same for a 10- and a 1000-token row; the price is that
it is a biased (but bounded, low-variance) estimate of the sequence ratio.

Modes (`RolloutCorrectionConfig.mode`), applied to the policy-gradient surrogate only:

    off    no weight (the loss runs exactly as before); the statistics are still logged
    tis    min(w, cap)                          truncated IS: bias traded for bounded variance
    mis    w if low <= w <= high, else 0        masked IS: a token (a whole row at sequence level)
                                                whose numerics disagree too much leaves the loss

w is computed from two constants (π_old, recorded before the update or detached, and the
sampler's recorded log-probs), so it is DETACHED: it scales the gradient, it has none of its own.
A weight of 0 keeps the token in the loss's normaliser (like IcePop; the token count a loss type
divides by never changes), so masking many tokens shrinks the step rather than renormalising it.

How it composes with the rest of the loss (GRPO and PPO alike):
  * PPO clip: the weight multiplies the CLIPPED surrogate, −w · min(r A, clip(r, 1−ε, 1+ε) A),
    where r = π_θ/π_old. The clip bounds how far θ moves from π_old; w says how much the sample
    counts. They multiply: w never enters the clip, and the clip fractions are r's.
  * μ > 1 updates per batch: π_old is fixed for the batch (the sampler's record, or, recomputed,
    the first update's own forward) and the sampler's log-probs are the engine's record, so w is the same at every
    one of the μ updates; only r moves.
  * GSPO (importance_sampling_level: sequence) and loss types: the weight multiplies the per-token
    surrogate before aggregation, whatever r's level or the normaliser.
  * KL and entropy terms (β·k3 to π_ref, −c_H·H, kl_importance_correction's ratio): not reweighted;
    they are regularisers measured on the sampled tokens, and the weight is about the sample's
    share of the policy gradient.
  * Guided groups (GRPO guidance): an oracle demonstration was not sampled by anyone, so it has
    no π_sampler (its recorded log-probs are 0); its rows are left out (weight 1, not in the
    statistics), as they are already left out of the ratio (π_old := π_θ there).
  * Same numerics on both sides (old_logprobs: sampling, where π_old IS the sampler's record):
    w = exp(0) = 1 exactly, so every mode is a no-op there.

The statistics (`rollout/...` in training/metric_keys.py): the mismatch KL(π_sampler ‖ π_old)
per trained token by Schulman's k3 estimator, w − 1 − log w (≥ 0, unbiased under samples from
π_sampler, which is what the tokens are), the mean and max of w before truncation or masking, and
the share of tokens (rows, at sequence level) truncated or masked.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch

from agentic_rl.config import Config

CorrectionMode = Literal["off", "tis", "mis"]
CorrectionLevel = Literal["token", "sequence"]
DEFAULT_CAP = 2.0
"""TIS's cap C when `cap` is unset (the TIS paper's and verl's 2)."""
DEFAULT_BAND = (0.5, 2.0)
"""MIS's [low, high] when unset: a factor of 2 either way."""


@dataclasses.dataclass(frozen=True)
class RolloutCorrectionConfig(Config):
    """Importance weights w = π_old/π_sampler on the policy loss, for rollouts decoded by other
    numerics than the trainer (algorithms/rollout_correction.py). Validated at construction."""

    mode: CorrectionMode = "off"
    """off: no weight. tis: each trained token's clipped surrogate times min(w, cap) (truncated IS).
    mis: times w where low <= w <= high, else 0 (masked IS: the token, or at level sequence the
    whole row, leaves the loss; normalisers still count it). w is detached and multiplies the
    PPO-clipped surrogate −min(r·A, clip(r)·A), never the clip itself, nor the KL or entropy terms;
    π_old is fixed for a batch, so w is the same at each of its μ updates; guided (oracle) rows get
    w = 1. Turn it on (tis) wherever the sampler's numerics differ from the trainer's:
    rollout.dtype bfloat16 (or auto where bf16 is fast) with float32 training, or train
    mixed_precision bf16 decoding in float32; with the same numerics on both sides w = 1 and it
    changes nothing. The mismatch statistics (rollout/mismatch_kl, rollout/is_weight_*) are logged
    every step whatever the mode."""
    level: CorrectionLevel = "token"
    """token: one w per trained token. sequence: one w per row (token sequence), the geometric mean
    of its token weights, exp(mean of log π_old − log π_sampler) over its trained tokens (not the
    product, whose spread grows with the row's length), applied to all its tokens."""
    cap: float | None = None
    """tis only: the truncation cap C >= 1 (unset: 2.0). Weights above it count as C."""
    low: float | None = None
    """mis only: the band's lower end, 0 <= low < 1 (unset: 0.5). Tokens (rows) with w below it are masked."""
    high: float | None = None
    """mis only: the band's upper end, > 1 (unset: 2.0). Tokens (rows) with w above it are masked."""

    def __post_init__(self) -> None:
        key = "rollout_correction"
        for name, value, mode in (("cap", self.cap, "tis"), ("low", self.low, "mis"), ("high", self.high, "mis")):
            if value is not None and self.mode != mode:
                raise ValueError(
                    f"{key}.{name}={value} is only used by mode {mode} (mode is {self.mode!r}); "
                    f"remove it, or set {key}.mode: {mode}"
                )
        if self.cap is not None and self.cap < 1.0:
            raise ValueError(
                f"{key}.cap={self.cap} must be >= 1: a cap below 1 would shrink the weight of tokens whose "
                f"numerics agree (w = 1), so the correction would act where there is nothing to correct; "
                f"use e.g. {DEFAULT_CAP}"
            )
        low, high = self.band
        if not 0.0 <= low < 1.0:
            raise ValueError(
                f"{key}.low={low} must be in [0, 1): tokens whose numerics agree (w = 1) must stay in the band"
            )
        if not high > 1.0:
            raise ValueError(
                f"{key}.high={high} must be > 1: tokens whose numerics agree (w = 1) must stay in the band"
            )

    @property
    def truncation_cap(self) -> float:
        """TIS's cap as used: `cap`, or DEFAULT_CAP when unset."""
        return DEFAULT_CAP if self.cap is None else self.cap

    @property
    def band(self) -> tuple[float, float]:
        """MIS's (low, high) as used: each end as set, or DEFAULT_BAND's."""
        return (DEFAULT_BAND[0] if self.low is None else self.low, DEFAULT_BAND[1] if self.high is None else self.high)


def rollout_correction(
    old_logps: torch.Tensor, sampler_logps: torch.Tensor, mask: torch.Tensor, cfg: RolloutCorrectionConfig
) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
    """The weights to multiply the per-token policy surrogate by, and the mismatch statistics.

    Args:
        old_logps: (B, T) log π_old, in the training precision (detached here).
        sampler_logps: (B, T) log π_sampler: what the engine recorded when it sampled each token
            (Trajectory.logprobs), NOT a re-scoring.
        mask: (B, T) 1 on the tokens the loss trains, 0 elsewhere (prompt, observations, padding,
            and rows that have no sampler, e.g. oracle demonstrations); any dtype. Mask-0 positions
            never enter a weight, a sequence mean or a statistic: their log-ratio is zeroed before
            exp (their log-probs may be arbitrary, and exp(+big) * 0 = NaN).
        cfg: the correction settings.
    Returns:
        weights: None for mode off; else detached, (B, T) at level token or (B, 1) at level
            sequence, 1 at mask-0 positions and on rows without a trained token.
        metrics: detached scalars: "rollout/mismatch_kl" (mean k3 per trained token),
            "rollout/is_weight_mean" and "rollout/is_weight_max" (w before truncation or masking,
            over trained tokens, or rows at level sequence), and "rollout/is_truncated_frac" (tis)
            or "rollout/is_masked_frac" (mis): the share of them truncated or masked. With nothing
            trained they read as no mismatch: 0, 1, 1 and 0.
    """
    if (
        tuple(old_logps.shape) != tuple(sampler_logps.shape)
        or tuple(mask.shape) != tuple(old_logps.shape)
        or old_logps.dim() != 2
    ):
        raise ValueError(
            f"old_logps {tuple(old_logps.shape)}, sampler_logps {tuple(sampler_logps.shape)} and mask "
            f"{tuple(mask.shape)} must all be (B, T)"
        )
    trained = mask.bool()  # (B, T)
    # Zero the log-ratio off-mask BEFORE exp: padding and observation log-probs may be arbitrary.
    token_log_w = torch.where(trained, old_logps.detach() - sampler_logps.detach(), 0.0)  # (B, T): log w
    k3 = torch.expm1(token_log_w) - token_log_w  # (B, T): w − 1 − log w >= 0, 0 off-mask
    if cfg.level == "sequence":
        tokens = trained.sum(-1, keepdim=True)  # (B, 1)
        log_w = token_log_w.sum(-1, keepdim=True) / tokens.clamp(min=1)  # (B, 1): log of the geometric mean
        counted = tokens > 0  # (B, 1): rows with a trained token
    else:
        log_w, counted = token_log_w, trained  # (B, T) each
    w = torch.exp(log_w)  # (B, T) or (B, 1)
    metrics = {
        "rollout/mismatch_kl": _masked_mean(k3, trained, empty=0.0),
        "rollout/is_weight_mean": _masked_mean(w, counted, empty=1.0),
        "rollout/is_weight_max": torch.where(counted, w, -torch.inf).max()
        if bool(counted.any())
        else torch.ones((), dtype=w.dtype),
    }
    if cfg.mode == "off":
        return None, metrics
    if cfg.mode == "tis":
        applied = torch.clamp(w, max=cfg.truncation_cap)  # (B, T) or (B, 1)
        metrics["rollout/is_truncated_frac"] = _masked_mean((w > cfg.truncation_cap).to(w.dtype), counted, empty=0.0)
    else:
        low, high = cfg.band
        inside = (w >= low) & (w <= high)  # (B, T) or (B, 1)
        applied = torch.where(inside, w, 0.0)  # (B, T) or (B, 1)
        metrics["rollout/is_masked_frac"] = _masked_mean((~inside).to(w.dtype), counted, empty=0.0)
    return applied, metrics  # (B, T) or (B, 1): 1 where nothing is trained (log w = 0 there, inside every cap and band)


def _masked_mean(values: torch.Tensor, where: torch.Tensor, empty: float) -> torch.Tensor:
    """Mean of `values` over the True positions of `where` (same shape), or `empty` when there are none."""
    count = where.sum()
    if not bool(count > 0):
        return torch.tensor(empty, dtype=values.dtype)
    return torch.where(where, values, 0.0).sum() / count
