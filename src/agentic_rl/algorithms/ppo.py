"""PPO's pieces for agent episodes: GAE over the policy's tokens, the clipped surrogate, the clipped
value loss, and KL in the reward. Pure tensor code, no I/O, no model.

Shape legend (every comment below):
    B  episodes in the batch
    T  tokens per (right-padded) episode: prompt, policy turns, tool observations, padding
    mask (B, T): 1 on policy tokens (what the policy sampled), 0 elsewhere

An agent episode interleaves policy turns with tool observations:

    position   P P P | A A A | O O | A A | pad
    mask       0 0 0 | 1 1 1 | 0 0 | 1 1 | 0

The MDP's steps are the policy tokens only. Observation tokens are not actions: they get no
advantage and no value target, and the value at them is never read. But the return flows across
them: the last token of a turn bootstraps from the value of the first token of the next turn,
as if the observation were part of the environment's transition (it is). So GAE runs over the
policy tokens of each row in order, skipping every mask-0 position:

    δ_k = r_k + γ V_{k+1} − V_k           k-th policy token of the row, V_{n} = 0 at the end
    A_k = δ_k + γ λ A_{k+1}               (A_n = 0)
    R_k = A_k + V_k                        the value target

Rewards sit on policy tokens: a turn's reward on its last token, the outcome reward on the
episode's last policy token, and with KL in the reward, −β·(log π_old − log π_ref) on every
policy token (InstructGPT's per-token penalty, verl's `use_kl_in_reward`). A reward on a mask-0
position is an error (it would silently vanish), not something to move.

Where the KL goes (`PPOLossConfig.kl_mode`):
  * "reward" (the default, InstructGPT; verl's `use_kl_in_reward`): the penalty shapes the advantage, so the
    value model learns the KL-regularised return and the per-token credit includes it.
  * "loss": the GRPO form, β·k3 added to the per-token loss; the advantage then sees only the
    environment's rewards.

The losses, per policy token t (r = exp(logp − old_logp), ε the clip range):
    policy  −w min(r A, clip(r, 1 − ε, 1 + ε) A)   [+ β k3 in "loss" mode]   [− c_H H]
    value   ½ max((V − R)², (clip(V, V_old − ε_V, V_old + ε_V) − R)²)   (PPO2's clipped value loss)
    total   policy + vf_coef · value
each averaged over all policy tokens of the batch ("token-mean", verl's default). w is the
sampler/trainer mismatch weight (detached; 1 unless `is_weights` is passed), as in GRPO:
algorithms/rollout_correction.py.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal, Sequence

import torch

from agentic_rl.algorithms.spans import spread_over_spans
from agentic_rl.config import Config, Fraction, NonNegativeFloat, PositiveFloat, refuse_unused

KLMode = Literal["reward", "loss"]


@dataclasses.dataclass
class PPOLossConfig(Config):
    """Every knob of the PPO objective. Validated at construction."""

    RENAMED_KEYS: ClassVar[dict[str, str]] = {
        "gamma": "gamma_per_token (PPO discounts per token; GRPO's advantage.gamma_per_turn per turn)",
        "lam": "lam_per_token",
    }

    epsilon: PositiveFloat = 0.2
    """Clip range of the policy ratio."""
    value_clip: PositiveFloat | None = 0.2
    """ε_V: clip range of the new value around the old one (None: the plain squared error)."""
    vf_coef: NonNegativeFloat = 0.5
    """Weight of the value loss in the total (shared trunk: the two losses share gradients)."""
    gamma_per_token: Fraction = 1.0
    """γ, the discount per policy token (1: undiscounted, the usual choice for language episodes)."""
    lam_per_token: Fraction = 1.0
    """GAE's λ, per policy token: 1 is the Monte-Carlo return minus V (verl's default), smaller
    values lean on V. λ decays the outcome reward by λ^k over the k tokens that follow, and an
    agent episode has ~100 policy tokens: λ = 0.95 leaves 0.95^100 ≈ 0.006 of the outcome at the
    first token while V is still untrained, so the first turn learns almost nothing."""
    beta: NonNegativeFloat = 0.0
    """KL weight (0: no reference model is needed)."""
    kl_mode: KLMode = "reward"
    """Where the KL goes: "reward" (per-token −β(log π_old − log π_ref) in the rewards) or "loss" (β·k3)."""
    whiten_advantages: bool = True
    """Normalise the advantages over the whole batch's policy tokens to mean 0, std 1 (`whiten`,
    applied by the trainer once per batch, before the batch is split into micro-batches)."""
    entropy_coef: NonNegativeFloat = 0.0
    """c_H: weight of an entropy bonus (0: off)."""

    def __post_init__(self) -> None:
        if self.beta == 0:
            refuse_unused(
                self, ["kl_mode"], prefix="loss.", used_with="loss.beta > 0", now="loss.beta is 0: no KL term"
            )

    @property
    def needs_reference(self) -> bool:
        """True iff π_ref log-probs are needed (β > 0)."""
        return self.beta != 0.0


def kl_penalized_rewards(
    rewards: torch.Tensor, old_logps: torch.Tensor, ref_logps: torch.Tensor, mask: torch.Tensor, beta: float
) -> torch.Tensor:
    """(B, T) rewards minus β·(log π_old − log π_ref) on every policy token (the k1 estimate of the
    KL of the sampling policy to the reference, per token)."""
    penalty = torch.where(mask.bool(), old_logps - ref_logps, 0.0)  # (B, T)
    return rewards - beta * penalty


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
    bootstrap: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), (B, T) each, 0 at every mask-0 position (module docstring).

    rewards: (B, T), non-zero only on policy tokens. values: (B, T) the value model's estimate at
    each position (read at policy tokens only). mask: (B, T) 1 on policy tokens.
    bootstrap: (B, 2) the (value, advantage) of the policy token that follows each row's last one
    in ANOTHER row (a later token sequence of the same episode: `sequence_gae`); None: 0, the
    episode ends with the row.
    """
    if rewards.shape != values.shape or rewards.shape != mask.shape:
        raise ValueError(
            f"rewards {tuple(rewards.shape)}, values {tuple(values.shape)} and mask {tuple(mask.shape)} must all be (B, T)"
        )
    on_policy = mask.bool()  # (B, T)
    if bool((rewards[~on_policy] != 0).any()):
        raise ValueError(
            "a reward sits on a mask-0 position (prompt, observation or padding); put each reward on a "
            "policy token: a turn's on its last token, the outcome on the episode's last policy token"
        )
    values = values.detach()
    advantages = torch.zeros_like(rewards)  # (B, T)
    next_value = torch.zeros_like(rewards[:, 0])  # (B,): V of the next policy token (0 past the end)
    next_advantage = torch.zeros_like(rewards[:, 0])  # (B,)
    if bootstrap is not None:
        next_value, next_advantage = (
            bootstrap[:, 0].to(rewards.dtype).clone(),
            bootstrap[:, 1].to(rewards.dtype).clone(),
        )  # (B,) each
    for t in range(rewards.shape[1] - 1, -1, -1):  # right to left; mask-0 columns carry the state through
        here = on_policy[:, t]  # (B,)
        delta = rewards[:, t] + gamma * next_value - values[:, t]  # (B,)
        advantage = delta + gamma * lam * next_advantage  # (B,)
        advantages[:, t] = torch.where(here, advantage, 0.0)
        next_value = torch.where(here, values[:, t], next_value)
        next_advantage = torch.where(here, advantage, next_advantage)
    returns = torch.where(on_policy, advantages + values, 0.0)  # (B, T): the value targets
    return advantages, returns


def sequence_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
    row_episode: Sequence[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """`gae` for episodes that span several rows (token sequences of an episode whose history is
    not a prefix: consecutive rows of one episode, oldest first; row_episode[r] names r's episode).

    The return flows across sequences exactly as across an observation: a row's last policy token
    bootstraps from the (value, advantage) of the next row's first policy token, so the result
    equals `gae` over the concatenation of each episode's policy tokens. Rows are solved from each
    episode's last sequence backwards, one batched `gae` call per depth; an episode of one row is
    a plain `gae` row. (R, T) in, (advantages, returns) (R, T) out."""
    rows = len(row_episode)
    depth = [0] * rows  # later rows of the same episode
    for r in range(rows - 2, -1, -1):
        depth[r] = depth[r + 1] + 1 if row_episode[r + 1] == row_episode[r] else 0
    advantages, returns = torch.zeros_like(rewards), torch.zeros_like(rewards)  # (R, T)
    first = torch.zeros(
        rows, 2, dtype=rewards.dtype
    )  # (R, 2): (V, A) at each row's first policy token, or its bootstrap
    has_policy = mask.bool().any(-1)  # (R,)
    first_position = mask.float().argmax(-1)  # (R,)
    for level in range(max(depth, default=-1) + 1):
        index = torch.tensor([r for r in range(rows) if depth[r] == level], dtype=torch.long)  # (n,)
        boot = torch.zeros(len(index), 2, dtype=rewards.dtype)  # (n, 2)
        if level > 0:
            boot = first[index + 1]
        adv, ret = gae(rewards[index], values[index], mask[index], gamma, lam, boot)  # (n, T) each
        advantages[index], returns[index] = adv, ret
        at = first_position[index][:, None]  # (n, 1)
        here = torch.stack(
            [values[index].detach().gather(1, at)[:, 0].to(rewards.dtype), adv.gather(1, at)[:, 0]], -1
        )  # (n, 2)
        first[index] = torch.where(has_policy[index][:, None], here, boot)
    return advantages, returns


def token_rewards(
    turn_rewards: Sequence[Sequence[float]], policy_spans: Sequence[Sequence[object]], num_tokens: int
) -> torch.Tensor:
    """(B, T) float64 rewards: turn k's reward on the last token of its span [start, end), 0 elsewhere.

    turn_rewards: per row, one reward per policy turn (an empty list: a row that is not trained,
    e.g. a failed episode, gets no reward). policy_spans: per row, the turns' half-open token
    ranges, as (start, end) tuples or objects with .start/.end (`Trajectory.policy_spans`).
    """
    return spread_over_spans(turn_rewards, policy_spans, num_tokens, on="last", dtype=torch.float64)  # (B, T)


def masked_moments(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(3,) float64 [count, sum, sum of squares] of `values` over the mask-1 positions: summed over
    processes, they give `whiten` the statistics of the whole batch."""
    weights = mask.to(torch.float64)
    v = values.to(torch.float64) * weights
    return torch.stack([weights.sum(), v.sum(), (v * values.to(torch.float64)).sum()])


def whiten(
    values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8, moments: torch.Tensor | None = None
) -> torch.Tensor:
    """(B, T) values normalised to mean 0 and std 1 over the mask-1 positions (unbiased std); 0 elsewhere.

    moments: the [count, sum, sum of squares] of the whole batch (`masked_moments`, summed over
    processes) when `values` is one process's share of it; None: this tensor's own.
    """
    if moments is None:
        weights = mask.to(values.dtype)
        count = weights.sum()
        if count < 2:
            raise ValueError(f"whitening needs at least 2 policy tokens, got {int(count)}")
        mean = (values * weights).sum() / count
        variance = (((values - mean) * weights) ** 2).sum() / (count - 1)
    else:
        count, total, squares = (float(x) for x in moments)
        if count < 2:
            raise ValueError(f"whitening needs at least 2 policy tokens, got {int(count)}")
        mean = total / count
        variance = max(squares - count * mean * mean, 0.0) / (count - 1)
        variance = torch.tensor(variance, dtype=values.dtype)
    return torch.where(mask.bool(), (values - mean) / torch.sqrt(variance + eps), 0.0)


def ppo_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    values: torch.Tensor,
    old_values: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    cfg: PPOLossConfig,
    ref_logps: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    num_tokens: float | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The total PPO loss (a scalar) and its parts, all (B, T) inputs; see the module docstring.

    advantages (already whitened when cfg.whiten_advantages: whitening is over the whole batch, so
    the trainer does it before splitting) and returns come from `gae`; old_values are the values
    at sampling time (the value-clip anchor). num_tokens: the policy tokens of the whole batch,
    when this call sees one micro-batch of it (sums over micro-batches then equal the full-batch
    token mean); None: this call's own count. The metrics are always means over this call's own
    policy tokens (the loop averages them over micro-batches). is_weights: (B, T) or (B, 1), detached,
    the rollout-correction weights (`rollout_correction`; None: 1): they multiply the clipped
    surrogate only, not the clip, the value loss, the KL or the entropy term.
    """
    shape = tuple(logps.shape)
    for name, tensor in (
        ("old_logps", old_logps),
        ("values", values),
        ("old_values", old_values),
        ("advantages", advantages),
        ("returns", returns),
        ("mask", mask),
    ):
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}; every input must be (B, T) = {shape}")
    if cfg.kl_mode == "loss" and cfg.needs_reference and (ref_logps is None or tuple(ref_logps.shape) != shape):
        raise ValueError(f"kl_mode=loss with beta={cfg.beta} needs ref_logps of shape {shape}")
    if cfg.entropy_coef and entropy is None:
        raise ValueError("entropy_coef > 0 needs the differentiable entropy")
    if is_weights is not None and (tuple(is_weights.shape) not in (shape, (shape[0], 1)) or is_weights.requires_grad):
        raise ValueError(f"is_weights must be detached and (B, T) = {shape} or (B, 1); got {tuple(is_weights.shape)}")
    trained = mask.bool()  # (B, T)
    weights = mask.to(logps.dtype)  # (B, T)
    count = (weights.sum() if num_tokens is None else torch.as_tensor(float(num_tokens), dtype=weights.dtype)).clamp(
        min=1.0
    )
    log_ratio = torch.where(trained, logps - old_logps, 0.0)  # (B, T): zeroed before exp (no inf * 0)
    ratio = torch.exp(log_ratio)  # (B, T)
    clipped = torch.clamp(ratio, 1.0 - cfg.epsilon, 1.0 + cfg.epsilon)  # (B, T)
    per_token = -torch.min(ratio * advantages, clipped * advantages)  # (B, T)
    if is_weights is not None:
        per_token = per_token * is_weights  # (B, T): the weight multiplies the clipped surrogate
    metrics: dict[str, torch.Tensor] = {}
    own = weights.sum().clamp(min=1.0)  # the metrics are means over this call's tokens, whatever num_tokens is
    if cfg.kl_mode == "loss" and cfg.needs_reference:
        ref_minus_logp = torch.where(trained, ref_logps - logps, 0.0)  # (B, T)
        k3 = torch.exp(ref_minus_logp) - ref_minus_logp - 1.0  # (B, T)
        per_token = per_token + cfg.beta * k3
        metrics["loss/kl"] = (k3.detach() * weights).sum() / own
    if cfg.entropy_coef:
        per_token = per_token - cfg.entropy_coef * torch.where(trained, entropy, 0.0)
    policy = (per_token * weights).sum() / count  # ()
    squared = (values - returns) ** 2  # (B, T)
    if cfg.value_clip is not None:
        clipped_values = old_values + torch.clamp(values - old_values, -cfg.value_clip, cfg.value_clip)  # (B, T)
        squared = torch.maximum(squared, (clipped_values - returns) ** 2)
    value = 0.5 * (squared * weights).sum() / count  # ()
    metrics.update(
        {
            "loss/policy": policy.detach() * count / own,
            "loss/value": value.detach() * count / own,
            "loss/ratio_mean": (ratio.detach() * weights).sum() / own,
            "loss/clip_ratio_region": (
                ((ratio.detach() - clipped.detach()).abs() > 0).to(weights.dtype) * weights
            ).sum()
            / own,
        }
    )
    return policy + cfg.vf_coef * value, metrics
