"""Independent float64 references of the GRPO advantages and loss: plain Python loops over
sequences, tokens and turns, written apart from the library (tests/test_grpo_loss.py checks the
library against them; the trainer and lever tests reuse them on real batches)."""

from __future__ import annotations

import math
import statistics

import torch

from agentic_rl.algorithms.grpo import GRPOLossConfig


def reference_advantages(rewards: list[float], group_size: int, scale: str) -> list[float]:
    """A_i = r_i - mean(group), divided by (unbiased std + 1e-4) of the group or of the batch."""
    out = []
    for i, reward in enumerate(rewards):
        group = rewards[(i // group_size) * group_size:(i // group_size + 1) * group_size]
        divisor = {"group": statistics.stdev(group) + 1e-4, "batch": statistics.stdev(rewards) + 1e-4, "none": 1.0}
        out.append((reward - statistics.fmean(group)) / divisor[scale])
    return out


def reference_loss(logps, old_logps, advantages, mask, cfg: GRPOLossConfig, ref_logps, entropy=None):
    """The GRPO objective written token by token. logps is a (B, T) float64 leaf tensor."""
    batch, length = mask.shape
    clip_high = cfg.epsilon if cfg.epsilon_high is None else cfg.epsilon_high
    sequence_sums, counts = [], []
    for i in range(batch):
        tokens = [t for t in range(length) if mask[i, t] > 0]
        if cfg.importance_sampling_level == "sequence" and tokens:
            sequence_log_ratio = sum(logps[i, t] - old_logps[i, t] for t in tokens) / len(tokens)
        total = torch.zeros((), dtype=torch.float64)
        for t in tokens:
            token_log_ratio = logps[i, t] - old_logps[i, t]
            log_ratio = sequence_log_ratio if cfg.importance_sampling_level == "sequence" else token_log_ratio
            ratio = torch.exp(log_ratio)
            advantage = float(advantages[i] if advantages.dim() == 1 else advantages[i, t])
            clipped = torch.clamp(ratio, 1 - cfg.epsilon, 1 + clip_high)
            loss = -torch.minimum(ratio * advantage, clipped * advantage)
            if cfg.beta:
                delta = ref_logps[i, t] - logps[i, t]
                kl = torch.exp(delta) - delta - 1
                loss = loss + cfg.beta * (kl * ratio if cfg.kl_importance_correction else kl)
            if cfg.entropy_coef:
                loss = loss - cfg.entropy_coef * entropy[i, t]
            total = total + loss
        sequence_sums.append(total)
        counts.append(len(tokens))
    if cfg.loss_type == "grpo":
        return sum(s / max(n, 1) for s, n in zip(sequence_sums, counts)) / batch
    if cfg.loss_type in ("dapo", "token", "bnpo"):
        return sum(sequence_sums) / max(sum(counts), 1)
    return sum(sequence_sums) / (batch * cfg.max_completion_length)



def reference_turn_advantages(turn_returns, group_size, baseline, eps=1e-4):
    """float64 loops, written apart from the library: group mean and unbiased std of the G_0,
    the baseline of each turn (G_0's mean, or the mean over the group of the returns-to-go at t,
    0 past an episode's end), equal values left unscaled."""
    out = []
    for row, returns in enumerate(turn_returns):
        group = turn_returns[row - row % group_size : row - row % group_size + group_size]
        starts = [r[0] for r in group]
        mean = sum(starts) / group_size
        std = math.sqrt(sum((x - mean) ** 2 for x in starts) / (group_size - 1))
        divisor = 1.0 if max(starts) == min(starts) else std + eps
        values = []
        for t, value in enumerate(returns):
            at_t = [r[t] if t < len(r) else 0.0 for r in group]
            b = mean if baseline == "start" else sum(at_t) / group_size
            values.append((value - b) / divisor)
        out.append(values)
    return out
