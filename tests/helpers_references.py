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
        group = rewards[(i // group_size) * group_size : (i // group_size + 1) * group_size]
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


# ---------------------------------------------------------------------- one sum in two orders

REORDERED_SUM_RTOL = 1e-9
"""How far apart two float64 computations of one sum may be, relative to the tensor's largest entry.

Two code paths that sum the same terms in another order (micro-batch layouts, a shared prefix,
padding trimmed or not) agree only up to rounding, and in float32 that rounding depends on the
CPU's kernels: the same gradient comparison differed by 3.8e-7 of a ~0.1 scale on an AVX512
EPYC and by less than 1e-7 on an AMX Xeon. In float64 the unit roundoff is u = 2^-53 ≈ 1.1e-16,
and reordering a sum of n terms moves it by about √n·u of the terms' scale (at worst n·u): for
the ~1e5 terms behind one LoRA gradient entry that is ~1e-13, at worst ~1e-11. Measured on the
live-rows gradient of tests/test_grpo_trainer.py: float32 6.9e-6 of the scale (AVX2 EPYC),
float64 with transformers' float32 RMSNorms 6.4e-8, `float64_model` 3.4e-15. 1e-9 sits two
orders above the worst case, whatever the kernels, and seven below what a real bug does (a row
left out or a normaliser off by 5/8 moves a gradient by more than 1e-2 of its scale). Compare
float32 or bf16 paths this way by running both in float64 (`float64_model`), not by widening a
float32 tolerance until one machine passes."""


def _rms_norm_in_input_dtype(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """transformers' RMSNorm (Llama, Qwen3) with its arithmetic in the input's dtype: the same
    formula, without the cast to float32 that would round a float64 model's activations."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def float64_model(model: torch.nn.Module) -> torch.nn.Module:
    """`model` in float64 throughout, in place: parameters and buffers, and its RMSNorms, which
    transformers computes in float32 whatever the model's dtype (so `.double()` alone leaves float32
    rounding, 6e-8, inside every layer: a shared-prefix gradient then differs from the plain one at
    float32's scale). Returns the model."""
    import types

    model.double()
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon"):
            module.forward = types.MethodType(_rms_norm_in_input_dtype, module)
    return model


def assert_same_sum(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    """Each float64 tensor of `actual` equals the one of `expected` up to summation order:
    |a − e| ≤ REORDERED_SUM_RTOL · max|e|, elementwise; an all-zero `expected` must be exactly 0."""
    assert actual.keys() == expected.keys(), f"different tensors: {sorted(actual.keys() ^ expected.keys())}"
    for name, want in expected.items():
        got = actual[name]
        assert got.dtype == want.dtype == torch.float64, f"{name}: compare in float64, got {got.dtype} and {want.dtype}"
        scale = float(want.detach().abs().max())
        torch.testing.assert_close(got, want, atol=REORDERED_SUM_RTOL * scale, rtol=0, msg=name)
