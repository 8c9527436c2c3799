"""GRPO advantages and the clipped policy loss: pure tensor code, no I/O, no model.

Shape legend (used in every comment below):
    B  sequences in the batch (= number of prompts * G)
    G  group size: samples per prompt (`num_generations` in TRL)
    T  tokens per (right-padded) sequence; prompt/observation/padding positions have mask 0
    P  number of prompts (= B // G)

Batch layout that `group_advantages` assumes (G = 3, P = 2):

    row      0    1    2  |  3    4    5
    prompt   p0   p0   p0 |  p1   p1   p1        rows [g*G, (g+1)*G) share one prompt

The loss, per trained token t of sequence i (A_i: advantage, r: importance ratio):

    r_{i,t}   = exp(logp_{i,t} - old_logp_{i,t})                       (token level)
              = exp(mean_t (logp_{i,t} - old_logp_{i,t}))  for all t   (sequence level, GSPO)
    l_{i,t}   = -w_{i,t} min(r A_i, clip(r, 1 - eps, 1 + eps_high) A_i) + beta * k3_{i,t} - c_H * H_{i,t}
    w_{i,t}   = rollout-correction weight (detached; 1 unless `is_weights` is passed: the
                sampler/trainer mismatch, algorithms/rollout_correction.py)
    k3_{i,t}  = exp(ref - logp) - (ref - logp) - 1                     (Schulman's k3 estimator)
                (times r_{i,t} when kl_importance_correction, TRL 1.16's default)
    H_{i,t}   = entropy of pi_theta's next-token distribution at t (entropy_coef = c_H, default 0)

then aggregated by `GRPOLossConfig.loss_type`.

Old log-probs and mu (updates per batch). `old_logps` must be the log-probs of the weights that
SAMPLED the batch: the rollout engine's logprobs, or those weights' forward (the trainer records the
first update's, before its optimizer step changes them).
With mu = 1 and the loss computed from those same weights, ratio == 1 everywhere, so
`old_logps = logps.detach()` gives the identical loss and gradient (TRL does exactly this; see
tests/test_grpo_loss.py::test_detached_old_logps_equal_sampling_logps_when_on_policy). With mu > 1
the detach trick is wrong: it pins the ratio at 1 and disables clipping.

How this departs from the GRPO paper (Shao et al. 2024, DeepSeekMath):
  * None for "grpo" with a token-level ratio: same clipped surrogate, same per-token k3 KL inside
    the 1/|o_i| sum. The other loss types aggregate the KL with the same token weights as the
    surrogate (as TRL does), so under "dapo" a long sequence's KL counts more.
  * Loss types "dapo"/"token", "dr_grpo" and "bnpo" are later fixes of the paper's per-sequence
    length normalisation ("grpo"); "grpo" is the paper's (and the seed's) objective.
  * The std of the group uses Bessel's correction (unbiased), as TRL does; the paper leaves it open.
  * epsilon_high (DAPO's clip-higher) and the sequence-level ratio (GSPO, Zheng et al. 2025) are
    extensions.

How this departs from TRL 1.16 (`GRPOTrainer._compute_loss`), on purpose:
  * No division by gradient-accumulation steps inside the loss: the training loop owns that.
    For "dapo"/"token", pass `num_items_in_batch` (trained tokens of the whole accumulation window)
    to get TRL's window-global token normalisation; without it the local token count is used.
  * Log-ratios and KL terms are zeroed at mask-0 positions BEFORE `exp`, so garbage log-probs on
    padding cannot overflow to inf and turn the masked loss into NaN (inf * 0).
  * Sequence-level (GSPO) clip metrics are means over sequences with >= 1 trained token; TRL
    divides by all B rows. The loss and gradients are identical (tests/test_grpo_vs_trl.py).
  * TRL 1.16 defaults to `use_bias_correction_kl=True` (k3 times the ratio); we default to the
    paper's plain k3 and offer TRL's form as `kl_importance_correction=True`.
  * Defaults: TRL 1.16 uses loss_type="dapo", beta=0.0 and bf16 autocast; ours are the paper's
    "grpo" and beta=0.04, and precision is the caller's choice (nothing here autocasts).
  * TRL's vLLM IS correction is `is_weights` from algorithms/rollout_correction.py (TIS/MIS, token
    or sequence level; its sequence weight is the geometric mean of token weights, not TRL's
    product). TRL's other extras (delta two-sided clip, entropy masks, cispo/sapo/vespo/luspo) are
    not implemented.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal, get_args

import torch

from agentic_rl.config import Config, Derived, FractionBelowOne, NonNegativeFloat, OpenFraction, PositiveFloat


LossType = Literal["grpo", "dapo", "token", "dr_grpo", "bnpo"]
RewardScaling = Literal["group", "batch", "none"]
DR_GRPO_DENOMINATOR = (
    "for loss_type dr_grpo, the most policy tokens an episode can hold: "
    "min(rollout.max_turns × rollout.max_turn_tokens, rollout.max_episode_tokens)"
)


@dataclasses.dataclass(frozen=True)
class GRPOLossConfig(Config):
    """Every knob of the GRPO objective. Validated at construction."""

    loss_type: LossType = "grpo"
    """How per-token losses become one scalar:
    "grpo": mean over each sequence's trained tokens, then mean over the B sequences (paper, seed).
    "dapo" (alias "token"): sum over all trained tokens / number of trained tokens (DAPO); pass
        `num_items_in_batch` to `grpo_loss` to normalise by a whole accumulation window.
    "dr_grpo": sum over all trained tokens / (B * max_completion_length), a constant (Dr. GRPO).
    "bnpo": sum / trained tokens of this micro-batch (TRL's "bnpo"; "dapo" without a window count)."""
    scale_rewards: RewardScaling = "group"
    """Advantage scaling after subtracting the group mean: "group" divides by the group's std,
    "batch" by the std of all B rewards, "none" does not divide (Dr. GRPO). Used by `group_advantages`."""
    epsilon: OpenFraction = 0.2
    """Lower clip: the ratio is clipped below at 1 - epsilon. 0 < epsilon < 1."""
    epsilon_high: PositiveFloat | None = None
    """Upper clip: the ratio is clipped above at 1 + epsilon_high (DAPO clip-higher, e.g. 0.28).
    None means epsilon_high = epsilon (see `clip_high`)."""
    beta: NonNegativeFloat = 0.04
    """Weight of the k3 KL(pi_theta || pi_ref) penalty (GRPO paper: 0.04). 0 skips the reference
    entirely: `grpo_loss` then needs no `ref_logps`."""
    kl_importance_correction: bool = False
    """Multiply each token's k3 by the (differentiable) importance ratio, as in DeepSeek-V3.2, so
    the KL gradient is the unbiased reverse-KL gradient even off-policy. Changes the gradient even
    on-policy (ratio == 1 but its gradient is not 0). TRL 1.16's `use_bias_correction_kl`, which
    TRL turns ON by default; the GRPO paper (our default) uses plain k3. Needs beta > 0."""
    importance_sampling_level: Literal["token", "sequence"] = "token"
    """"token": one ratio per token (PPO/GRPO). "sequence": one ratio per sequence,
    exp(mean over its tokens of logp - old_logp), applied to all its tokens (GSPO)."""
    entropy_coef: FractionBelowOne = 0.0
    """c_H: weight of an entropy bonus, -c_H * H per trained token, aggregated like the surrogate.
    Keeps a near-deterministic policy exploring (0: off; the GRPO paper has none). Needs the
    differentiable entropy passed to `grpo_loss`."""
    max_completion_length: Annotated[int | None, Derived(DR_GRPO_DENOMINATOR)] = None
    """The constant denominator of "dr_grpo" (per sequence): the most policy tokens one episode
    may hold. Not a config key: GRPOConfig derives it from the rollout limits (DR_GRPO_DENOMINATOR);
    a direct caller of `grpo_loss` with "dr_grpo" sets it. Rejected for any other loss_type."""

    @property
    def needs_reference(self) -> bool:
        """True iff the loss has a KL term, so π_ref log-probs must be computed (β > 0)."""
        return self.beta != 0.0

    @property
    def zero_advantage_rows_are_inert(self) -> bool:
        """True iff a row whose advantages are all 0 adds exactly 0 to this loss and its gradient
        (no KL or entropy term; bnpo's normaliser depends on the micro-batch's rows)."""
        return not self.needs_reference and self.entropy_coef == 0 and self.loss_type != "bnpo"

    def __post_init__(self) -> None:
        if self.kl_importance_correction and self.beta == 0.0:
            raise ValueError(
                "kl_importance_correction=True reweights the KL term, but beta=0 has no KL term; "
                "set beta > 0 or drop kl_importance_correction"
            )
        if self.loss_type == "dr_grpo" and self.max_completion_length is not None and self.max_completion_length <= 0:
            raise ValueError(
                f"loss_type='dr_grpo' divides by B * max_completion_length, so max_completion_length must be a "
                f"positive int (got {self.max_completion_length}); set it to the rollout's policy-token budget"
            )
        if self.loss_type != "dr_grpo" and self.max_completion_length is not None:
            raise ValueError(
                f"max_completion_length={self.max_completion_length} is only used by loss_type='dr_grpo' "
                f"(loss_type is {self.loss_type!r}); remove it, or switch to 'dr_grpo'"
            )

    @property
    def clip_high(self) -> float:
        """The upper clip actually used: epsilon_high, or epsilon when epsilon_high is None."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high


def group_advantages(
    rewards: torch.Tensor, group_size: int, scale: RewardScaling = "group", eps: float = 1e-4
) -> torch.Tensor:
    """A_i = r_i - mean(r over i's group), optionally divided by (std + eps).

    Rows [g*G, (g+1)*G) form group g (see the module docstring). The std is the UNBIASED one
    (Bessel's correction, torch.std's default), exactly like TRL 1.16's `nanstd`; so is the
    "batch" std. With scale="batch" the mean is still the group's (TRL does the same).
    A group whose rewards are all equal gets A = 0 exactly (its divisor is 1: it has no std).

    Args:
        rewards: (B,) float, one scalar per sequence.
        group_size: G, samples per prompt.
        scale: "group" | "batch" | "none" (see GRPOLossConfig.scale_rewards).
        eps: added to the std before dividing (TRL: 1e-4).
    Returns:
        (B,) advantages, same dtype as rewards.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be (B,), one per sequence; got shape {tuple(rewards.shape)}")
    baseline, divisor = _baseline_and_divisor(rewards, group_size, scale, eps)  # (B,), (B,)
    return (rewards - baseline) / divisor  # (B,)


def _exact_group_mean(grouped: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(constant, mean) over dim 1 of grouped (P, G, ...): where a group's values are all equal,
    the mean is that value itself, so they centre to exactly 0. A float mean can miss it (eight
    rewards of 0.1 average to 0.1 + 7e-9 in float32), and after division by std + eps that leaves
    A = -7e-5 on every row, a gradient of pure rounding that Adam would scale up to a full-size
    step, and that defeats skipping."""
    constant = grouped.amax(dim=1) == grouped.amin(dim=1)  # (P, ...)
    return constant, torch.where(constant, grouped[:, 0], grouped.mean(dim=1))  # (P, ...) each


def _baseline_and_divisor(
    rewards: torch.Tensor, group_size: int, scale: str, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the group mean, and what the centred reward is divided by (std + eps, or 1)."""
    _check_groups(rewards.shape[0], group_size)
    if scale not in get_args(RewardScaling):
        raise ValueError(f"scale={scale!r} is not one of {get_args(RewardScaling)}")
    grouped = rewards.view(-1, group_size)  # (P, G)
    constant, mean = _exact_group_mean(grouped)  # (P,), (P,)
    baseline = mean.repeat_interleave(group_size)  # (B,)
    # One sample has no std (torch.std would be NaN): leave it unscaled, as TRL does in eval.
    # Nor do equal rewards: their std is 0, and they are left unscaled too. Their own centred values
    # are exactly 0, so this changes nothing for them; it matters for `turn_credit.turn_advantages`, whose
    # per-turn returns differ from the episode returns, and which must not divide those differences
    # by eps alone (a group of eight equal failures gave advantages of ~6000 that way).
    if scale == "group" and group_size > 1:
        divisor = torch.where(
            constant, torch.ones_like(constant, dtype=rewards.dtype), grouped.std(dim=1) + eps
        )  # (P,)
        return baseline, divisor.repeat_interleave(group_size)  # (B,), (B,)
    if scale == "batch" and rewards.numel() > 1 and bool(rewards.amax() != rewards.amin()):
        return baseline, (rewards.std() + eps).expand_as(rewards)  # (B,), (B,)
    return baseline, torch.ones_like(rewards)  # (B,), (B,)


def _check_groups(batch_size: int, group_size: int) -> None:
    if group_size < 1:
        raise ValueError(f"group_size (G) must be >= 1, got {group_size}")
    if batch_size % group_size != 0:
        raise ValueError(
            f"batch size {batch_size} is not a multiple of the group size G={group_size}. GRPO's baseline is the "
            f"mean reward of ALL G samples of the same prompt, so every prompt's G samples must sit in the batch "
            f"together, as consecutive rows [g*G, (g+1)*G). Make the number of sequences prompts * G "
            f"(e.g. {max(1, batch_size // group_size) * group_size} or {(batch_size // group_size + 1) * group_size})."
        )


def grpo_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: GRPOLossConfig,
    ref_logps: torch.Tensor | None = None,
    num_items_in_batch: int | torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    sequence_weights: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The clipped GRPO surrogate (times the rollout-correction weight) plus beta * k3 KL, minus
    entropy_coef * H, aggregated by `cfg.loss_type`.

    Args:
        logps: (B, T) log pi_theta of each token, with grad (from `sequence_logprobs`).
        old_logps: (B, T) log pi_old: the sampling weights' log-probs (see the module docstring
            on mu; `logps.detach()` is valid only when these are the sampling weights).
        advantages: (B,) one per sequence, or (B, T) per token (multi-turn credit).
        mask: (B, T) 1 on trained (policy) tokens, 0 elsewhere; any dtype.
        cfg: the loss settings.
        ref_logps: (B, T) log pi_ref; required iff cfg.beta > 0, never read when beta == 0.
        num_items_in_batch: only for "dapo"/"token": the trained-token count to divide by (e.g. of
            the whole accumulation window); default: mask.sum() of this batch.
        entropy: (B, T) differentiable entropy of pi_theta per token; required iff cfg.entropy_coef > 0.
        sequence_weights: only for "grpo": (B,) weight of each row's per-sequence mean (None: 1).
            A trainer whose episode spans several rows passes each row's share of the episode's
            tokens, so the episode's mean is over all its tokens (training/episodes.py).
        is_weights: (B, T) or (B, 1), detached: the sampler/trainer mismatch weights from
            `rollout_correction` (None: 1). They multiply the clipped surrogate of each token
            (a row's weight, all its tokens), never the clip, the KL or the entropy term.
    Returns:
        loss: scalar, differentiable w.r.t. logps.
        metrics: detached scalars, all means over trained tokens (over sequences for the clip
            fractions at sequence level): "loss/kl" (the k3 term that enters the loss, ratio-weighted
            if kl_importance_correction, as TRL logs it; only if beta > 0), "loss/ratio_mean",
            "loss/clip_ratio_low" (ratio < 1-eps with A < 0), "loss/clip_ratio_high"
            (ratio > 1+eps_high with A > 0), "loss/clip_ratio_region" (either).
    """
    _check_loss_inputs(logps, old_logps, advantages, mask, cfg, ref_logps, num_items_in_batch)
    if is_weights is not None and (
        tuple(is_weights.shape) not in (tuple(logps.shape), (logps.shape[0], 1)) or is_weights.requires_grad
    ):
        raise ValueError(
            f"is_weights must be detached and (B, T) = {tuple(logps.shape)} or (B, 1); got "
            f"{tuple(is_weights.shape)}{' with grad' if is_weights.requires_grad else ''} (see rollout_correction)"
        )
    if cfg.entropy_coef != 0.0 and (
        entropy is None or tuple(entropy.shape) != tuple(logps.shape) or not entropy.requires_grad
    ):
        raise ValueError(
            f"entropy_coef={cfg.entropy_coef} > 0 needs the differentiable (B, T) entropy of pi_theta; "
            "pass `entropy` from sequence_logprobs(..., with_entropy=True, entropy_grad=True)"
        )
    trained = mask.bool()  # (B, T)
    weights = mask.to(logps.dtype)  # (B, T)
    advantages = advantages[:, None] if advantages.dim() == 1 else advantages  # (B, 1) or (B, T)
    # Zero the log-ratio off-mask BEFORE exp: padding log-probs may be arbitrary, and exp(+big) * 0 = NaN.
    log_ratio = torch.where(trained, logps - old_logps, 0.0)  # (B, T)
    if cfg.importance_sampling_level == "sequence":
        tokens_per_sequence = weights.sum(-1, keepdim=True).clamp(min=1.0)  # (B, 1)
        log_ratio = log_ratio.sum(-1, keepdim=True) / tokens_per_sequence  # (B, 1), GSPO's length-normalised ratio
    ratio = torch.exp(log_ratio)  # (B, T) or (B, 1)
    clipped_ratio = torch.clamp(ratio, 1.0 - cfg.epsilon, 1.0 + cfg.clip_high)  # (B, T) or (B, 1)
    per_token_loss = -torch.min(ratio * advantages, clipped_ratio * advantages)  # (B, T) or (B, 1)
    per_token_loss = per_token_loss.expand_as(logps)  # (B, T): a sequence ratio applies to all its tokens
    if is_weights is not None:
        per_token_loss = per_token_loss * is_weights  # (B, T): (B, 1) weights broadcast over the row
    metrics: dict[str, torch.Tensor] = {}
    if cfg.needs_reference:
        ref_minus_logp = torch.where(trained, ref_logps - logps, 0.0)  # (B, T)
        per_token_kl = torch.exp(ref_minus_logp) - ref_minus_logp - 1.0  # (B, T), k3 >= 0
        if cfg.kl_importance_correction:
            per_token_kl = per_token_kl * ratio  # (B, T): ratio is (B, T), or (B, 1) broadcast (GSPO)
        per_token_loss = per_token_loss + cfg.beta * per_token_kl  # (B, T)
        metrics["loss/kl"] = _masked_mean(per_token_kl.detach(), weights)
    if cfg.entropy_coef != 0.0:
        per_token_loss = per_token_loss - cfg.entropy_coef * torch.where(trained, entropy, 0.0)  # (B, T)
    if sequence_weights is not None and (cfg.loss_type != "grpo" or tuple(sequence_weights.shape) != (logps.shape[0],)):
        raise ValueError(
            f"sequence_weights must be (B,) = ({logps.shape[0]},) and only with loss_type 'grpo' "
            f"(got {tuple(sequence_weights.shape)} with {cfg.loss_type!r})"
        )
    loss = _aggregate(per_token_loss, weights, cfg, num_items_in_batch, sequence_weights)  # ()
    metrics.update(_ratio_metrics(ratio.detach(), advantages, weights, cfg))
    return loss, metrics


def _aggregate(
    per_token_loss: torch.Tensor,
    weights: torch.Tensor,
    cfg: GRPOLossConfig,
    num_items: int | torch.Tensor | None,
    sequence_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """(B, T) per-token losses -> scalar, per cfg.loss_type (see GRPOLossConfig.loss_type)."""
    masked_sum = (per_token_loss * weights).sum()  # ()
    if cfg.loss_type == "grpo":
        per_sequence = (per_token_loss * weights).sum(-1) / weights.sum(-1).clamp(min=1.0)  # (B,)
        if sequence_weights is not None:
            per_sequence = per_sequence * sequence_weights.to(per_sequence.dtype)  # (B,)
        return per_sequence.mean()
    if cfg.loss_type in ("dapo", "token"):
        count = weights.sum() if num_items is None else torch.as_tensor(num_items, dtype=weights.dtype)
        return masked_sum / count.clamp(min=1.0)
    if cfg.loss_type == "bnpo":
        return masked_sum / weights.sum().clamp(min=1.0)
    assert cfg.loss_type == "dr_grpo", f"unhandled loss_type {cfg.loss_type}"
    if cfg.max_completion_length is None:
        raise ValueError(
            "loss_type='dr_grpo' divides by B * max_completion_length, which is unset: GRPOConfig derives it "
            f"({DR_GRPO_DENOMINATOR}); a direct caller sets GRPOLossConfig.max_completion_length"
        )
    return masked_sum / (weights.shape[0] * cfg.max_completion_length)


def _ratio_metrics(
    ratio: torch.Tensor, advantages: torch.Tensor, weights: torch.Tensor, cfg: GRPOLossConfig
) -> dict[str, torch.Tensor]:
    """Clip fractions and the mean ratio; per sequence when ratio and advantages are both (B, 1)."""
    if ratio.shape[1] == 1 and advantages.shape[1] == 1:  # GSPO, one advantage per sequence
        weights = (weights.sum(-1, keepdim=True) > 0).to(weights.dtype)  # (B, 1): sequences with tokens
    is_low = ((ratio < 1.0 - cfg.epsilon) & (advantages < 0)).to(weights.dtype)  # (B, T) or (B, 1)
    is_high = ((ratio > 1.0 + cfg.clip_high) & (advantages > 0)).to(weights.dtype)  # (B, T) or (B, 1)
    return {
        "loss/ratio_mean": _masked_mean(ratio.expand_as(weights), weights),
        "loss/clip_ratio_low": _masked_mean(is_low.expand_as(weights), weights),
        "loss/clip_ratio_high": _masked_mean(is_high.expand_as(weights), weights),
        "loss/clip_ratio_region": _masked_mean(torch.maximum(is_low, is_high).expand_as(weights), weights),
    }


def _masked_mean(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return (values * weights).sum() / weights.sum().clamp(min=1.0)


def _check_loss_inputs(logps, old_logps, advantages, mask, cfg, ref_logps, num_items_in_batch) -> None:
    shape = tuple(logps.shape)
    if logps.dim() != 2:
        raise ValueError(f"logps must be (B, T); got {shape}")
    if tuple(old_logps.shape) != shape or tuple(mask.shape) != shape:
        raise ValueError(f"logps {shape}, old_logps {tuple(old_logps.shape)} and mask {tuple(mask.shape)} must match")
    if tuple(advantages.shape) not in ((shape[0],), shape):
        raise ValueError(f"advantages must be (B,) = ({shape[0]},) or (B, T) = {shape}; got {tuple(advantages.shape)}")
    if cfg.needs_reference and (ref_logps is None or tuple(ref_logps.shape) != shape):
        raise ValueError(
            f"beta={cfg.beta} > 0 needs ref_logps of shape {shape} for the KL penalty; pass the reference "
            "log-probs, or set beta=0 to train without a reference"
        )
    if num_items_in_batch is not None and cfg.loss_type not in ("dapo", "token"):
        raise ValueError(
            f"num_items_in_batch is only used by loss_type 'dapo'/'token' (got {cfg.loss_type!r}); don't pass it"
        )
