"""GRPO advantages, losses and log-probs against slow, independent float64 references.

Shapes: B sequences (= prompts * G), G group size, T tokens, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from helpers_references import (
    assert_same_sum,
    float64_model,
    reference_advantages,
    reference_loss,
    reference_turn_advantages,
)

from agentic_rl.algorithms.grpo import GRPOLossConfig, group_advantages, grpo_loss
from agentic_rl.algorithms.turn_credit import discounted_turn_returns, token_advantages_from_turns, turn_advantages
from agentic_rl.models.logprobs import sequence_logprobs, token_entropy, token_logprobs
from agentic_rl.models.backbone import shared_prefix_length

# ----------------------------------------------------------------------------------------------
# Batches for the references (tests/helpers_references.py: plain Python loops, float64 scalars).
# ----------------------------------------------------------------------------------------------


def ragged_batch(batch: int, length: int, seed: int):
    """Random float64 log-probs with a right-padded ragged mask: a 1-token row and an empty row."""
    generator = torch.Generator().manual_seed(seed)
    mask = torch.zeros(batch, length)
    for i in range(batch):
        start = int(torch.randint(1, length // 2, (1,), generator=generator))
        stop = {0: start + 1, 1: start}.get(i, int(torch.randint(start + 1, length + 1, (1,), generator=generator)))
        mask[i, start:stop] = 1
    logps = -torch.rand(batch, length, generator=generator, dtype=torch.float64) * 3  # (B, T)
    old_logps = logps + 0.4 * torch.randn(batch, length, generator=generator, dtype=torch.float64)  # (B, T)
    ref_logps = logps + 0.5 * torch.randn(batch, length, generator=generator, dtype=torch.float64)  # (B, T)
    rewards = torch.randn(batch, generator=generator, dtype=torch.float64)  # (B,)
    return logps, old_logps, ref_logps, rewards, mask


def config_for(loss_type, scale, level, beta, epsilon_high, kl_correction=False) -> GRPOLossConfig:
    return GRPOLossConfig(
        loss_type=loss_type,
        scale_rewards=scale,
        importance_sampling_level=level,
        beta=beta,
        kl_importance_correction=kl_correction,
        epsilon=0.2,
        epsilon_high=epsilon_high,
        max_completion_length=9 if loss_type == "dr_grpo" else None,
    )


VARIANTS = [
    variant
    for variant in itertools.product(
        ["grpo", "dapo", "token", "dr_grpo", "bnpo"],
        ["group", "batch", "none"],
        ["token", "sequence"],
        [0.0, 0.04],
        [None, 0.28],
        [False, True],
    )
    if variant[3] or not variant[5]  # the KL importance correction needs beta > 0
]


@pytest.mark.parametrize("loss_type,scale,level,beta,epsilon_high,kl_correction", VARIANTS)
def test_every_loss_variant_matches_float64_loop(loss_type, scale, level, beta, epsilon_high, kl_correction):
    """Guards against aggregation, clipping, GSPO-ratio or KL slips in the vectorised loss: the
    loss AND d loss / d logps must equal a token-by-token loop, on ragged masks with a 1-token
    row and an empty row, from rewards through advantages."""
    cfg = config_for(loss_type, scale, level, beta, epsilon_high, kl_correction)
    group_size = 3
    seed = VARIANTS.index((loss_type, scale, level, beta, epsilon_high, kl_correction))
    logps, old_logps, ref_logps, rewards, mask = ragged_batch(6, 9, seed=seed)
    advantages = group_advantages(rewards, group_size, scale)  # (B,)
    expected_advantages = reference_advantages(rewards.tolist(), group_size, scale)
    assert advantages.tolist() == pytest.approx(expected_advantages, abs=1e-12)

    ours = logps.clone().requires_grad_(True)
    loss, metrics = grpo_loss(ours, old_logps, advantages, mask, cfg, ref_logps if beta else None)
    (grad,) = torch.autograd.grad(loss, ours)
    theirs = logps.clone().requires_grad_(True)
    expected_advantages = torch.tensor(expected_advantages, dtype=torch.float64)  # (B,)
    expected = reference_loss(theirs, old_logps, expected_advantages, mask, cfg, ref_logps)
    (expected_grad,) = torch.autograd.grad(expected, theirs)
    assert float(loss.detach()) == pytest.approx(float(expected.detach()), abs=1e-12, rel=1e-10)
    torch.testing.assert_close(grad, expected_grad, atol=1e-12, rtol=1e-10)
    assert all(math.isfinite(float(value)) for value in metrics.values())
    assert ("loss/kl" in metrics) == bool(beta)
    if level == "token":  # the data must actually exercise both branches of the min
        assert 0 < float(metrics["loss/clip_ratio_region"]) < 1


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo", "bnpo"])
def test_entropy_bonus_matches_float64_loop(loss_type):
    """Guards the entropy bonus's sign, its aggregation (the same token weights as the surrogate)
    and its gradient, which must reach the entropy (the policy's logits), not only the log-probs."""
    cfg = dataclasses.replace(config_for(loss_type, "group", "token", 0.04, None), entropy_coef=0.01)
    logps, old_logps, ref_logps, rewards, mask = ragged_batch(6, 9, seed=11)
    advantages = group_advantages(rewards, 3, "group")
    entropy = torch.rand(6, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(5)) * 2  # (B, T)
    ours, our_entropy = logps.clone().requires_grad_(True), entropy.clone().requires_grad_(True)
    loss, _ = grpo_loss(ours, old_logps, advantages, mask, cfg, ref_logps, entropy=our_entropy)
    theirs, their_entropy = logps.clone().requires_grad_(True), entropy.clone().requires_grad_(True)
    expected = reference_loss(theirs, old_logps, advantages, mask, cfg, ref_logps, entropy=their_entropy)
    assert float(loss.detach()) == pytest.approx(float(expected.detach()), abs=1e-12)
    ours_grads = torch.autograd.grad(loss, [ours, our_entropy])
    expected_grads = torch.autograd.grad(expected, [theirs, their_entropy])
    for got, want in zip(ours_grads, expected_grads):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10)
    assert float(ours_grads[1].min()) < 0  # more entropy lowers the loss on every trained token
    without, _ = grpo_loss(logps, old_logps, advantages, mask, dataclasses.replace(cfg, entropy_coef=0.0), ref_logps)
    assert float(loss.detach()) < float(without)
    with pytest.raises(ValueError, match="differentiable"):
        grpo_loss(logps, old_logps, advantages, mask, cfg, ref_logps)


@pytest.mark.parametrize("kl_correction", [False, True])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_per_token_advantages_match_float64_loop(level, loss_type, kl_correction):
    """Guards the (B, T) advantage path (multi-turn credit) against broadcasting mistakes."""
    cfg = config_for(loss_type, "group", level, 0.04, 0.28, kl_correction)
    logps, old_logps, ref_logps, _, mask = ragged_batch(4, 8, seed=7)
    advantages = torch.randn(4, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3))  # (B, T)
    ours = logps.clone().requires_grad_(True)
    loss, _ = grpo_loss(ours, old_logps, advantages, mask, cfg, ref_logps)
    theirs = logps.clone().requires_grad_(True)
    expected = reference_loss(theirs, old_logps, advantages, mask, cfg, ref_logps)
    torch.testing.assert_close(torch.autograd.grad(loss, ours)[0], torch.autograd.grad(expected, theirs)[0])
    assert float(loss.detach()) == pytest.approx(float(expected.detach()), abs=1e-12)


def test_hand_computed_two_sequence_example():
    """Numbers worked by hand (epsilon 0.2, beta 0, old_logps 0, advantages A = [0.5, -0.5]):

    seq 0, two tokens, ratios 1.5, 0.9, A = +0.5:
        token 0: min(1.5*0.5, clip(1.5)=1.2 *0.5) = min(0.75, 0.60) = 0.60 -> loss -0.60 (clipped high)
        token 1: min(0.9*0.5, 0.9*0.5) = 0.45                              -> loss -0.45
    seq 1, one token (second is padding), ratio 0.5, A = -0.5:
        token 0: min(0.5*-0.5, clip(0.5)=0.8 *-0.5) = min(-0.25, -0.40)    -> loss +0.40 (clipped low)
    grpo:    mean(mean(-0.60, -0.45), 0.40) = mean(-0.525, 0.40) = -0.0625
    dapo:    (-0.60 - 0.45 + 0.40) / 3 tokens = -0.216666...
    dr_grpo: (-0.65) / (B=2 * max_completion_length=4) = -0.08125
    gradient (grpo) w.r.t. logps: only the unclipped token moves: -ratio*A/(2 tokens * 2 seqs)
        = -0.45 / 4 = -0.1125 at [0, 1]; 0 at the clipped tokens.
    clip fractions: low 1/3 tokens, high 1/3 tokens, region 2/3.
    """
    logps = torch.tensor([[math.log(1.5), math.log(0.9)], [math.log(0.5), 123.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    advantages = torch.tensor([0.5, -0.5], dtype=torch.float64)
    old_logps = torch.zeros_like(logps)
    expected = {"grpo": -0.0625, "dapo": -0.65 / 3, "dr_grpo": -0.08125}
    for loss_type, value in expected.items():
        cfg = GRPOLossConfig(loss_type=loss_type, beta=0.0, max_completion_length=4 if loss_type == "dr_grpo" else None)
        leaf = logps.clone().requires_grad_(True)
        loss, metrics = grpo_loss(leaf, old_logps, advantages, mask, cfg)
        assert float(loss) == pytest.approx(value, abs=1e-12)
        if loss_type == "grpo":
            (grad,) = torch.autograd.grad(loss, leaf)
            torch.testing.assert_close(grad, torch.tensor([[0.0, -0.1125], [0.0, 0.0]], dtype=torch.float64))
    assert float(metrics["loss/clip_ratio_low"]) == pytest.approx(1 / 3)
    assert float(metrics["loss/clip_ratio_high"]) == pytest.approx(1 / 3)
    assert float(metrics["loss/clip_ratio_region"]) == pytest.approx(2 / 3)


def test_detached_old_logps_equal_sampling_logps_when_on_policy():
    """With mu = 1 the sampling weights are the current weights, so TRL's shortcut
    old_logps = logps.detach() must give the same loss and gradient as the rollout's logprobs.
    Guards against a shortcut that silently changes the objective (e.g. detaching the ratio)."""
    logps, _, ref_logps, rewards, mask = ragged_batch(6, 9, seed=11)
    advantages = group_advantages(rewards, 3)
    for level in ("token", "sequence"):
        cfg = GRPOLossConfig(importance_sampling_level=level, epsilon_high=0.28)
        first = logps.clone().requires_grad_(True)
        loss_detached, _ = grpo_loss(first, first.detach(), advantages, mask, cfg, ref_logps)
        second = logps.clone().requires_grad_(True)
        loss_sampled, metrics = grpo_loss(second, logps.clone(), advantages, mask, cfg, ref_logps)
        assert float(loss_detached) == float(loss_sampled)
        torch.testing.assert_close(
            torch.autograd.grad(loss_detached, first)[0], torch.autograd.grad(loss_sampled, second)[0], atol=0, rtol=0
        )
        assert float(metrics["loss/ratio_mean"]) == 1.0 and float(metrics["loss/clip_ratio_region"]) == 0.0


def test_beta_zero_never_reads_the_reference():
    """beta = 0 must skip the reference entirely (docs/design.md invariant 4): None is accepted, and a
    NaN reference cannot leak into the loss."""
    logps, old_logps, _, rewards, mask = ragged_batch(6, 9, seed=5)
    cfg = GRPOLossConfig(beta=0.0)
    loss_none, metrics = grpo_loss(logps, old_logps, group_advantages(rewards, 3), mask, cfg, None)
    loss_nan, _ = grpo_loss(logps, old_logps, group_advantages(rewards, 3), mask, cfg, torch.full_like(logps, math.nan))
    assert float(loss_none) == float(loss_nan) and "loss/kl" not in metrics
    with pytest.raises(ValueError, match="needs ref_logps"):
        grpo_loss(logps, old_logps, group_advantages(rewards, 3), mask, GRPOLossConfig(beta=0.04), None)


def test_garbage_logps_on_padding_do_not_make_nan():
    """exp(huge log-ratio) * mask 0 = inf * 0 = NaN; padding log-probs must never reach exp."""
    logps, old_logps, ref_logps, rewards, mask = ragged_batch(6, 9, seed=2)
    logps = torch.where(mask.bool(), logps, 1e4).requires_grad_(True)
    for level in ("token", "sequence"):
        cfg = GRPOLossConfig(importance_sampling_level=level)
        loss, metrics = grpo_loss(logps, old_logps, group_advantages(rewards, 3), mask, cfg, ref_logps)
        (grad,) = torch.autograd.grad(loss, logps)
        assert torch.isfinite(loss) and torch.isfinite(grad).all() and (grad[mask == 0] == 0).all()
        assert all(math.isfinite(float(v)) for v in metrics.values())


def test_dapo_window_count_makes_micro_batches_sum_to_the_full_batch():
    """Gradient accumulation with 'dapo': dividing each micro-batch by the window's token count
    (num_items_in_batch) makes the summed micro-batch losses equal the one-batch loss."""
    logps, old_logps, ref_logps, rewards, mask = ragged_batch(6, 9, seed=9)
    advantages = group_advantages(rewards, 3)
    cfg = GRPOLossConfig(loss_type="dapo")
    full, _ = grpo_loss(logps, old_logps, advantages, mask, cfg, ref_logps)
    halves = [slice(0, 3), slice(3, 6)]
    summed = sum(
        grpo_loss(logps[h], old_logps[h], advantages[h], mask[h], cfg, ref_logps[h], num_items_in_batch=mask.sum())[0]
        for h in halves
    )
    assert float(summed) == pytest.approx(float(full), abs=1e-12)


# ----------------------------------------------------------------------------------------------
# Advantages and returns
# ----------------------------------------------------------------------------------------------


def test_group_advantages_hand_values_and_unbiased_std():
    """Rewards [1, 0, 0] -> mean 1/3, unbiased std sqrt(1/3); a constant group -> all zeros."""
    rewards = torch.tensor([1.0, 0.0, 0.0, 2.0, 2.0, 2.0], dtype=torch.float64)
    std = math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2)
    expected = [(2 / 3) / (std + 1e-4), (-1 / 3) / (std + 1e-4), (-1 / 3) / (std + 1e-4), 0.0, 0.0, 0.0]
    assert group_advantages(rewards, 3).tolist() == pytest.approx(expected, abs=1e-12)
    assert group_advantages(rewards, 3, "none").tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3, 0, 0, 0])


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("value", [0.1, 0.3, 1.1, -0.7, 1e-3])
def test_a_group_of_equal_rewards_gets_advantages_of_exactly_zero(value, scale):
    """Eight float32 rewards of 0.1 average to 0.1 + 7e-9; centred and divided by std + 1e-4 that
    was A = -7e-5 on every row: a gradient of rounding noise that Adam scales up to a full step,
    and that the zero-advantage skip cannot see. The advantages must be exactly 0.0."""
    rewards = torch.tensor([value] * 8 + [0.0, 1.0] * 4, dtype=torch.float32)
    advantages = group_advantages(rewards, 8, scale)
    assert advantages[:8].tolist() == [0.0] * 8
    assert float(advantages[8:].abs().min()) > 0.4
    turns = turn_advantages([[value]] * 8 + [[r] for r in [0.0, 1.0] * 4], 8, scale)
    assert [t[0] for t in turns[:8]] == [0.0] * 8


def test_batch_not_divisible_by_group_size_explains_the_rule():
    """Peers fail with an opaque view() error; ours must say why B % G matters and how to fix it."""
    with pytest.raises(ValueError, match=r"not a multiple of the group size G=4.*ALL G samples of the same prompt"):
        group_advantages(torch.zeros(6), 4)


@settings(max_examples=50, deadline=None)
@given(
    st.integers(1, 4).flatmap(
        lambda prompts: st.integers(2, 5).flatmap(
            lambda group: st.tuples(
                st.just(group), st.lists(st.floats(-10, 10), min_size=prompts * group, max_size=prompts * group)
            )
        )
    ),
    st.sampled_from(["group", "batch", "none"]),
)
def test_advantages_sum_to_zero_in_every_group(group_and_rewards, scale):
    """Property: subtracting the group mean leaves zero-sum advantages per group, for every scaling."""
    group_size, rewards = group_and_rewards
    advantages = group_advantages(torch.tensor(rewards, dtype=torch.float64), group_size, scale)
    sums = advantages.view(-1, group_size).sum(dim=1)
    assert torch.allclose(sums, torch.zeros_like(sums), atol=1e-6)


def test_discounted_turn_returns_by_hand():
    """gamma 0.9, rewards [0, 0, 1] -> [0.81, 0.9, 1.0]; ragged episodes keep their lengths."""
    returns = discounted_turn_returns([[0.0, 0.0, 1.0], [0.5], [1.0, 1.0]], gamma=0.9)
    assert returns[0] == pytest.approx([0.81, 0.9, 1.0])
    assert returns[1] == [0.5] and returns[2] == pytest.approx([1.9, 1.0])


def test_turn_advantages_reduce_to_grpo_with_terminal_reward_and_gamma_one():
    """With gamma = 1 and only a final reward, every turn must get the plain GRPO advantage."""
    turn_rewards = [[0.0, 1.0], [0.0, 0.0, 0.0], [1.0], [0.0, 2.0]]
    returns = discounted_turn_returns(turn_rewards, gamma=1.0)
    per_turn = turn_advantages(returns, group_size=2)
    plain = group_advantages(torch.tensor([sum(r) for r in turn_rewards], dtype=torch.float64), 2)
    for row, values in enumerate(per_turn):
        assert values == pytest.approx([float(plain[row])] * len(values), abs=1e-12)


def test_turn_advantages_on_a_ragged_group_match_the_hand_computed_float64_values():
    """γ = 0.5. Episode 0: rewards [0, 0, 1], returns-to-go [0.25, 0.5, 1]; episode 1: [0, 0, 0, 1],
    returns-to-go [0.125, 0.25, 0.5, 1]. Episode returns 0.25 and 0.125: mean 0.1875, unbiased
    std 0.0625·√2. start (mode turn): every turn against 0.1875. position (mode turn_position):
    turn t against the mean return-to-go at t, an ended episode counting 0: 0.1875, 0.375, 0.75,
    then (0 + 1) / 2 = 0.5 at the turn only episode 1 reaches (a mean over the episodes that reach
    it would give 1 there, and that turn an advantage of 0)."""
    returns = discounted_turn_returns([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0]], gamma=0.5)
    s = 0.0625 * math.sqrt(2) + 1e-4
    start = turn_advantages(returns, group_size=2, baseline="start")
    assert start[0] == pytest.approx([0.0625 / s, 0.3125 / s, 0.8125 / s], abs=1e-12)
    assert start[1] == pytest.approx([-0.0625 / s, 0.0625 / s, 0.3125 / s, 0.8125 / s], abs=1e-12)
    position = turn_advantages(returns, group_size=2, baseline="position")
    assert position[0] == pytest.approx([0.0625 / s, 0.125 / s, 0.25 / s], abs=1e-12)
    assert position[1] == pytest.approx([-0.0625 / s, -0.125 / s, -0.25 / s, 0.5 / s], abs=1e-12)
    with pytest.raises(ValueError, match="baseline='value'"):
        turn_advantages(returns, group_size=2, baseline="value")


@settings(max_examples=40, deadline=None)
@given(
    st.integers(2, 4).flatmap(
        lambda group: st.tuples(
            st.just(group),
            st.lists(
                st.lists(st.floats(-1, 1, allow_nan=False), min_size=1, max_size=6),
                min_size=2 * group,
                max_size=2 * group,
            ),
        )
    ),
    st.sampled_from([1.0, 0.95, 0.5]),
    st.sampled_from(["start", "position"]),
)
def test_turn_advantages_match_a_float64_reference_on_ragged_groups(group_and_rewards, gamma, baseline):
    """Property: two groups of episodes of 1–6 turns with any per-turn rewards give the reference's values."""
    group_size, turn_rewards = group_and_rewards
    returns = discounted_turn_returns(turn_rewards, gamma)
    got = turn_advantages(returns, group_size, baseline=baseline)
    expected = reference_turn_advantages(returns, group_size, baseline)
    for row in range(len(returns)):
        assert got[row] == pytest.approx(expected[row], rel=1e-9, abs=1e-9)


def test_a_group_of_identical_failures_is_never_divided_by_eps_alone():
    """plan: eight episodes cut at 20 turns of -0.05 each, γ = 0.95, all the same return. Their std
    is 0; dividing each turn's G_t − b by 1e-4 gave advantages up to 5915, so a group that compares
    nothing dominated the gradient. turn_position gives exactly 0; turn keeps its documented
    G_t − G_0 offsets (0 to +0.59), unscaled."""
    returns = discounted_turn_returns([[-0.05] * 20] * 8, gamma=0.95)
    start = turn_advantages(returns, 8)
    assert start[0][0] == 0.0 and start[0][-1] == pytest.approx(-0.05 + (1 - 0.95**20))
    assert max(max(row) for row in start) < 0.6
    assert all(v == 0.0 for row in turn_advantages(returns, 8, baseline="position") for v in row)


def test_turn_mode_credits_late_turns_of_a_failure_and_turn_position_does_not():
    """The bias `turn` documents, in numbers, as configs/plan.yaml's GRPO places rewards (env_steps
    with γ_s = 0.95: step k's reward on turn k as 0.95^k·r_k; advantage.gamma_per_turn 1): one 9-turn
    success and seven 20-turn failures (−0.05 per action, +1 at the goal). Against the mean G_0
    a failure's first turn gets −0.353 and its last +1.529; against the same turn's mean
    return-to-go its last turn gets G_19 / 8 / s ≈ −0.007 (the success has ended: 0)."""
    success = [-0.05 * 0.95**k for k in range(8)] + [0.95 * 0.95**8]
    failure = [-0.05 * 0.95**k for k in range(20)]
    returns = discounted_turn_returns([success] + [failure] * 7, gamma=1.0)
    start = turn_advantages(returns, 8, baseline="start")
    position = turn_advantages(returns, 8, baseline="position")
    assert start[1][0] == pytest.approx(-0.353, abs=1e-3) and start[1][-1] == pytest.approx(1.529, abs=1e-3)
    s = float(torch.tensor([r[0] for r in returns], dtype=torch.float64).std()) + 1e-4
    assert position[1][0] == start[1][0]
    assert position[1][-1] == pytest.approx(failure[-1] / 8 / s, abs=1e-12) and position[1][-1] == pytest.approx(
        -0.007, abs=1e-3
    )
    assert all(v < 0 for v in position[1]) and all(v > 0 for v in position[0])


def test_token_advantages_land_on_policy_spans_only():
    """Each turn's advantage covers exactly its [start, end) tokens; prompt/observation stay 0."""
    advantages = token_advantages_from_turns([[1.0, -2.0], [3.0]], [[(2, 4), (6, 7)], [(1, 3)]], num_tokens=8)
    expected = torch.tensor([[0, 0, 1, 1, 0, 0, -2, 0], [0, 3, 3, 0, 0, 0, 0, 0]], dtype=torch.float32)
    torch.testing.assert_close(advantages, expected)
    with pytest.raises(ValueError, match="outside"):
        token_advantages_from_turns([[1.0]], [[(5, 9)]], num_tokens=8)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"loss_type": "ppo"}, "loss_type"),
        ({"scale_rewards": "std"}, "scale_rewards"),
        ({"importance_sampling_level": "turn"}, "importance_sampling_level"),
        ({"epsilon": 1.0}, "epsilon"),
        ({"epsilon_high": 0.0}, "epsilon_high"),
        ({"beta": -0.1}, "beta"),
        ({"loss_type": "dr_grpo", "max_completion_length": 0}, "max_completion_length"),
        ({"beta": 0.0, "kl_importance_correction": True}, "beta=0 has no KL term"),
        ({"max_completion_length": 64}, "only used by loss_type='dr_grpo'"),
    ],
)
def test_config_rejects_bad_settings_with_a_reason(kwargs, message):
    """Every setting is used or rejected (docs/design.md invariant 6)."""
    with pytest.raises(ValueError, match=message):
        GRPOLossConfig(**kwargs)


# ----------------------------------------------------------------------------------------------
# Log-probs: the LM head on trained positions only, against a plain full forward
# ----------------------------------------------------------------------------------------------


def test_token_logprobs_and_entropy_match_log_softmax():
    """The chunked custom autograd function against log_softmax, values and gradients, in float64."""
    logits = torch.randn(3, 5, 17, dtype=torch.float64, requires_grad=True)  # (B, T, V)
    targets = torch.randint(0, 17, (3, 5))  # (B, T)
    ours = token_logprobs(logits, targets, temperature=0.7, rows_per_chunk=4)
    reference = torch.log_softmax(logits / 0.7, dim=-1).gather(-1, targets[..., None])[..., 0]
    torch.testing.assert_close(ours, reference)
    weights = torch.randn(3, 5, dtype=torch.float64)
    torch.testing.assert_close(
        torch.autograd.grad((ours * weights).sum(), logits)[0],
        torch.autograd.grad((reference * weights).sum(), logits)[0],
    )
    probs = torch.softmax(logits / 0.7, dim=-1)
    torch.testing.assert_close(token_entropy(logits, 0.7, rows_per_chunk=2), -(probs * probs.log()).sum(-1))


@pytest.fixture(scope="module")
def tiny_model_float64(tiny_qwen3, new_tiny_qwen3):
    """tiny-qwen3 in float64: what `load_model("tiny-qwen3", dtype=torch.float64)` returns."""
    return new_tiny_qwen3().double(), tiny_qwen3[1]


def ragged_token_batch(pad_id: int, vocab_size: int):
    """Right-padded ids with ragged lengths; the loss mask skips each row's 'prompt' and padding."""
    generator = torch.Generator().manual_seed(0)
    lengths, prompt_lengths, width = [12, 5, 9, 2], [4, 2, 1, 1], 12
    input_ids = torch.full((4, width), pad_id)  # (B, T)
    attention_mask = torch.zeros(4, width, dtype=torch.long)  # (B, T)
    loss_mask = torch.zeros(4, width)  # (B, T)
    for row, (length, prompt) in enumerate(zip(lengths, prompt_lengths)):
        input_ids[row, :length] = torch.randint(0, vocab_size, (length,), generator=generator)
        attention_mask[row, :length] = 1
        loss_mask[row, prompt:length] = 1
    loss_mask[0, 7:9] = 0  # an "observation" inside the first episode
    return input_ids, attention_mask, loss_mask


def full_forward_logprobs(model, input_ids, attention_mask, loss_mask, temperature):
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits  # (B, T, V)
    logps = torch.log_softmax(logits[:, :-1].double() / temperature, dim=-1)  # (B, T-1, V)
    gathered = logps.gather(-1, input_ids[:, 1:, None])[..., 0]  # (B, T-1)
    return torch.cat([torch.zeros_like(gathered[:, :1]), gathered], dim=1) * loss_mask  # (B, T)


def test_sequence_logprobs_equal_full_forward_values_and_gradients(tiny_model_float64):
    """Guards the LM-head-on-trained-positions fast path against off-by-one shifts and padding
    leaks: values (and parameter gradients) must equal log_softmax of a plain full forward."""
    model, tokenizer = tiny_model_float64
    batch = ragged_token_batch(tokenizer.pad_token_id, model.config.vocab_size)
    weights = torch.randn(batch[0].shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ours, entropy = sequence_logprobs(model, *batch, temperature=0.7, with_entropy=True)
    reference = full_forward_logprobs(model, *batch, temperature=0.7)
    torch.testing.assert_close(ours, reference, atol=1e-10, rtol=0)
    assert (ours[batch[2] == 0] == 0).all() and entropy.shape == ours.shape
    params = [p for p in model.parameters() if p.requires_grad]
    ours_grads = torch.autograd.grad((ours * weights).sum(), params)
    reference_grads = torch.autograd.grad((reference * weights).sum(), params)
    for mine, theirs in zip(ours_grads, reference_grads):
        torch.testing.assert_close(mine, theirs, atol=1e-10, rtol=1e-8)


def shared_prefix_batch(pad_id: int, vocab_size: int, prefix: int = 20):
    """Four right-padded rows that share their first `prefix` tokens (a system prompt), then ragged
    own tokens; each row's loss mask starts at a different place after the shared part."""
    generator = torch.Generator().manual_seed(2)
    shared = torch.randint(0, vocab_size, (prefix,), generator=generator)
    lengths, first_trained, width = (
        [prefix + 9, prefix + 4, prefix + 12, prefix + 2],
        [prefix + 3, prefix + 1, prefix + 6, prefix + 1],
        prefix + 12,
    )
    input_ids = torch.full((4, width), pad_id)  # (B, T)
    attention_mask = torch.zeros(4, width, dtype=torch.long)  # (B, T)
    loss_mask = torch.zeros(4, width)  # (B, T)
    for row, (length, first) in enumerate(zip(lengths, first_trained)):
        input_ids[row, :prefix] = shared
        input_ids[row, prefix:length] = torch.randint(0, vocab_size, (length - prefix,), generator=generator)
        attention_mask[row, :length] = 1
        loss_mask[row, first:length] = 1
    loss_mask[2, prefix + 8 : prefix + 10] = 0  # an observation inside the third episode
    return input_ids, attention_mask, loss_mask


def test_shared_prefix_runs_once_with_the_same_values_and_gradients(tiny_model_float64):
    """The shared prefix (system prompt, or a GRPO group's prompt) is run for one row and its KV
    repeated over the batch. Guards against position or mask offsets after the prefix and against
    gradients lost through the repeat: values and LoRA gradients must equal the plain pass."""
    import copy

    from peft import LoraConfig, get_peft_model

    model, tokenizer = tiny_model_float64
    peft_model = get_peft_model(
        float64_model(copy.deepcopy(model)),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], init_lora_weights=False),
    )
    batch = shared_prefix_batch(tokenizer.pad_token_id, model.config.vocab_size)
    assert shared_prefix_length(*batch) == 20  # first trained token at 21 in rows 1 and 3: P = 21 - 1
    weights = torch.randn(batch[0].shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    params = [p for p in peft_model.parameters() if p.requires_grad]
    shared, _ = sequence_logprobs(peft_model, *batch, temperature=0.7)
    plain, _ = sequence_logprobs(peft_model, *batch, temperature=0.7, share_prefix=False)
    torch.testing.assert_close(shared, full_forward_logprobs(peft_model, *batch, temperature=0.7), atol=1e-10, rtol=0)
    shared_grads = torch.autograd.grad((shared * weights).sum(), params)
    plain_grads = torch.autograd.grad((plain * weights).sum(), params)
    assert all(float(g.abs().max()) > 0 for g in plain_grads)
    # The prefix's values and gradients are the plain pass's summed in another order: equal up to
    # float64 rounding, with the RMSNorms in float64 too (float64_model), on any CPU.
    assert_same_sum({"logprobs": shared}, {"logprobs": plain})
    assert_same_sum({str(i): g for i, g in enumerate(shared_grads)}, {str(i): g for i, g in enumerate(plain_grads)})


def test_shared_prefix_length_by_hand():
    """P = common leading tokens, stopped one before the first trained position; 0 when it does
    not pay (one row, left padding, fewer than 16 tokens)."""
    ids = torch.tensor([list(range(30)), list(range(25)) + [7] * 5, list(range(30))])  # (3, 30)
    ones, mask = torch.ones_like(ids), torch.zeros(3, 30)
    mask[:, 28:] = 1
    assert shared_prefix_length(ids, ones, mask) == 25  # rows part at 25
    mask[1, 20] = 1
    assert shared_prefix_length(ids, ones, mask) == 19  # token 20 is trained: position 19 predicts it
    mask[1, 20], mask[0, 10] = 0, 1
    assert shared_prefix_length(ids, ones, mask) == 0  # 9 < 16 tokens: not worth a second call
    mask[0, 10] = 0
    assert shared_prefix_length(ids[:1], ones[:1], mask[:1]) == 0  # one row
    left_padded = ones.clone()
    left_padded[1, 0] = 0
    assert shared_prefix_length(ids, left_padded, mask) == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=2, max_size=5), st.integers(1, 40), st.integers(1, 3))
def test_shared_prefix_length_is_never_past_a_difference_or_a_trained_token(diverge_at, first_trained, vocab):
    """Property: the P leading tokens agree in every row, and no row trains a token at index <= P."""
    rows, width = len(diverge_at), 41
    ids = torch.zeros(rows, width, dtype=torch.long)
    for row, at in enumerate(diverge_at):
        ids[row, at:] = row + vocab  # row-specific tokens from `at` on
    mask = torch.zeros(rows, width)
    mask[0, first_trained:] = 1
    p = shared_prefix_length(ids, torch.ones_like(ids), mask)
    assert p == 0 or p >= 16
    assert (ids[:, :p] == ids[:1, :p]).all()
    assert p == 0 or not bool(mask[:, : p + 1].any())
    if min(diverge_at) >= 17 and first_trained >= 18:  # when sharing pays it is used, up to the bound
        assert p == min(min(diverge_at), first_trained - 1)


def test_sequence_logprobs_sees_through_peft_and_keeps_adapters_active(tiny_model_float64):
    """Under PEFT the backbone must be reached through get_base_model() (PeftModel.base_model is
    the tuner, not the decoder), and the LoRA layers must still apply; guards against scoring the
    base model while training the adapters."""
    import copy

    from peft import LoraConfig, get_peft_model

    model, tokenizer = tiny_model_float64
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    peft_model = get_peft_model(copy.deepcopy(model), lora)
    batch = ragged_token_batch(tokenizer.pad_token_id, model.config.vocab_size)
    ours, _ = sequence_logprobs(peft_model, *batch)
    torch.testing.assert_close(ours, full_forward_logprobs(peft_model, *batch, temperature=1.0), atol=1e-10, rtol=0)
    base, _ = sequence_logprobs(model, *batch)
    assert not torch.allclose(ours, base), "LoRA adapters had no effect: the base model was scored"
    with peft_model.disable_adapter():
        torch.testing.assert_close(sequence_logprobs(peft_model, *batch)[0], base, atol=1e-10, rtol=0)


def test_sequence_logprobs_rejects_a_trained_first_token(tiny_model_float64):
    """Token 0 has no context to be predicted from; a mask there is a collation bug."""
    model, tokenizer = tiny_model_float64
    input_ids, attention_mask, loss_mask = ragged_token_batch(tokenizer.pad_token_id, model.config.vocab_size)
    loss_mask[:, 0] = 1
    with pytest.raises(ValueError, match="first token has no context"):
        sequence_logprobs(model, input_ids, attention_mask, loss_mask)


def test_all_masked_batch_still_backpropagates_a_zero(tiny_model_float64):
    """A micro-batch with no trained token (all observations) must give zeros that backward()
    accepts, not an error, so one odd micro-batch cannot crash a training step."""
    model, tokenizer = tiny_model_float64
    input_ids, attention_mask, loss_mask = ragged_token_batch(tokenizer.pad_token_id, model.config.vocab_size)
    logps, _ = sequence_logprobs(model, input_ids, attention_mask, torch.zeros_like(loss_mask))
    assert (logps == 0).all() and logps.requires_grad
    logps.sum().backward()
    model.zero_grad(set_to_none=True)


def test_bfloat16_logits_are_scored_in_float32():
    """bf16 logits must not give bf16 log-probs (ratios of bf16 logps are off by ~1%)."""
    logits = torch.randn(6, 50, dtype=torch.float64)
    targets = torch.randint(0, 50, (6,))
    reference = torch.log_softmax(logits.bfloat16().double(), -1).gather(-1, targets[:, None])[:, 0]
    ours = token_logprobs(logits.bfloat16(), targets)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours.double(), reference, atol=1e-5, rtol=0)
