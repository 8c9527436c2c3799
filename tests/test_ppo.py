"""PPO's GAE, value loss and clipped surrogate against a float64 reference written independently:
per episode, the list of policy tokens only, walked with the textbook recursions."""

import math

import pytest
import torch

from agentic_rl.algorithms.ppo import (
    PPOLossConfig,
    gae,
    kl_penalized_rewards,
    masked_moments,
    ppo_loss,
    token_rewards,
    whiten,
)

# Two episodes, policy turns split by tool observations (mask 0), right-padded:
#   row 0: P P | A A A | O O | A A | pad     rewards: turn 1 gets 0.1 at its last token, outcome 1.0 at the end
#   row 1: P | A A | O O O | A | O | A A A   rewards: 0.1, 0.1, outcome 0.0
MASK = torch.tensor([[0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 0], [0, 1, 1, 0, 0, 0, 1, 0, 1, 1, 1]])
REWARDS = torch.zeros(2, 11, dtype=torch.float64)
REWARDS[0, 4], REWARDS[0, 8] = 0.1, 1.0
REWARDS[1, 2], REWARDS[1, 6], REWARDS[1, 10] = 0.1, 0.1, 0.0


def _values(seed=0):
    return torch.randn(2, 11, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _reference_gae(rewards, values, mask, gamma, lam):
    """The textbook recursion on each row's policy tokens, in pure Python floats."""
    advantages = [[0.0] * len(row) for row in mask.tolist()]
    returns = [[0.0] * len(row) for row in mask.tolist()]
    for b, row in enumerate(mask.tolist()):
        steps = [t for t, m in enumerate(row) if m]
        r = [float(rewards[b, t]) for t in steps]
        v = [float(values[b, t]) for t in steps] + [0.0]
        running = 0.0
        for k in reversed(range(len(steps))):
            running = r[k] + gamma * v[k + 1] - v[k] + gamma * lam * running
            advantages[b][steps[k]] = running
            returns[b][steps[k]] = running + v[k]
    return torch.tensor(advantages, dtype=torch.float64), torch.tensor(returns, dtype=torch.float64)


@pytest.mark.parametrize("gamma, lam", [(1.0, 0.95), (0.9, 0.8), (1.0, 1.0), (0.99, 0.0)])
def test_gae_matches_the_textbook_recursion_over_policy_tokens(gamma, lam):
    """Guards against GAE that bootstraps through observation tokens or drops γ/λ: it equals the textbook
    recursion over policy tokens only."""
    values = _values()
    advantages, returns = gae(REWARDS, values, MASK, gamma, lam)
    expected_a, expected_r = _reference_gae(REWARDS, values, MASK, gamma, lam)
    torch.testing.assert_close(advantages, expected_a, atol=1e-12, rtol=0)
    torch.testing.assert_close(returns, expected_r, atol=1e-12, rtol=0)


def test_observation_tokens_get_no_advantage_and_no_target_but_the_return_flows_across_them():
    """Guards against observation tokens leaking into the advantage or the value target, and against
    a return that stops at an observation instead of bootstrapping from the next turn."""
    values = _values(1)
    advantages, returns = gae(REWARDS, values, MASK, 1.0, 1.0)
    assert bool((advantages[MASK == 0] == 0).all()) and bool((returns[MASK == 0] == 0).all())
    # λ = γ = 1: every policy token's return is the sum of the rewards from it to the episode's end,
    # across the observations in between (row 0, first turn: 0.1 + 1.0).
    assert returns[0, 2].item() == pytest.approx(1.1, abs=1e-12)
    assert returns[1, 1].item() == pytest.approx(0.2, abs=1e-12)
    # Values at observation positions are never read: changing them changes nothing.
    poked = values.clone()
    poked[MASK == 0] = 1e6
    torch.testing.assert_close(
        gae(REWARDS, poked, MASK, 0.9, 0.8), gae(REWARDS, values, MASK, 0.9, 0.8), atol=0, rtol=0
    )


def test_a_reward_on_an_observation_token_is_refused():
    """Guards against a reward placed on an observation token (mask 0), which GAE would silently skip (invariant 2)."""
    rewards = REWARDS.clone()
    rewards[0, 5] = 1.0  # an observation position
    with pytest.raises(ValueError, match="mask-0"):
        gae(rewards, _values(), MASK, 1.0, 0.95)


def test_kl_in_the_reward_penalises_every_policy_token_by_its_log_ratio():
    """Guards against a KL-in-reward penalty on the wrong tokens or with the wrong sign: −β·(log π_old − log
    π_ref) on policy tokens, 0 elsewhere."""
    old = torch.randn(2, 11, dtype=torch.float64)
    ref = torch.randn(2, 11, dtype=torch.float64)
    shaped = kl_penalized_rewards(REWARDS, old, ref, MASK, beta=0.1)
    expected = REWARDS - 0.1 * (old - ref) * MASK
    torch.testing.assert_close(shaped, expected, atol=1e-12, rtol=0)
    assert bool((shaped[MASK == 0] == 0).all())


def _reference_loss(logps, old, values, old_values, adv, ret, mask, cfg):
    """float64 per-token loops: whitening, clipped surrogate, clipped value loss, token means."""
    positions = [(b, t) for b in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[b, t]]
    a = [float(adv[p]) for p in positions]
    if cfg.whiten_advantages:
        mean = sum(a) / len(a)
        std = math.sqrt(sum((x - mean) ** 2 for x in a) / (len(a) - 1) + 1e-8)
        a = [(x - mean) / std for x in a]
    policy = value = 0.0
    for (b, t), advantage in zip(positions, a):
        ratio = math.exp(float(logps[b, t]) - float(old[b, t]))
        clipped = min(max(ratio, 1 - cfg.epsilon), 1 + cfg.epsilon)
        policy += -min(ratio * advantage, clipped * advantage)
        v, v_old, target = float(values[b, t]), float(old_values[b, t]), float(ret[b, t])
        v_clipped = v_old + min(max(v - v_old, -cfg.value_clip), cfg.value_clip)
        value += 0.5 * max((v - target) ** 2, (v_clipped - target) ** 2)
    return policy / len(positions), value / len(positions)


@pytest.mark.parametrize("whiten_advantages", [True, False])
def test_ppo_loss_matches_a_float64_per_token_loop(whiten_advantages):
    """Guards against PPO's clipped policy and value losses drifting from a float64 per-token loop, and against
    gradient reaching masked tokens."""
    g = torch.Generator().manual_seed(3)
    old = torch.randn(2, 11, generator=g, dtype=torch.float64) - 2.0
    logps = (old + 0.3 * torch.randn(2, 11, generator=g, dtype=torch.float64)).requires_grad_(True)  # some ratios clip
    old_values = _values(4)
    values = (old_values + 0.4 * torch.randn(2, 11, generator=g, dtype=torch.float64)).requires_grad_(True)
    advantages, returns = gae(REWARDS, old_values, MASK, 1.0, 0.95)
    cfg = PPOLossConfig(whiten_advantages=whiten_advantages, value_clip=0.2, vf_coef=0.5)
    given = whiten(advantages, MASK) if whiten_advantages else advantages
    loss, metrics = ppo_loss(logps, old, values, old_values, given, returns, MASK, cfg)
    policy, value = _reference_loss(logps.detach(), old, values.detach(), old_values, advantages, returns, MASK, cfg)
    assert loss.item() == pytest.approx(policy + 0.5 * value, abs=1e-9)
    assert metrics["loss/policy"].item() == pytest.approx(policy, abs=1e-9)
    assert metrics["loss/value"].item() == pytest.approx(value, abs=1e-9)
    assert 0 < metrics["loss/clip_ratio_region"].item() < 1
    loss.backward()
    assert bool((logps.grad[MASK == 0] == 0).all()) and bool((values.grad[MASK == 0] == 0).all())


def test_whiten_uses_policy_tokens_only():
    """Guards against whitening over observation or padding tokens, whose values would shift the policy tokens'
    mean and scale."""
    x = torch.tensor([[1.0, 100.0, 3.0], [5.0, -50.0, 7.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 0, 1], [1, 0, 1]])
    out = whiten(x, mask)
    kept = out[mask.bool()]
    assert kept.mean().item() == pytest.approx(0.0, abs=1e-12) and kept.std().item() == pytest.approx(1.0, abs=1e-6)
    assert out[0, 1].item() == 0.0 and out[1, 1].item() == 0.0


def test_config_rejects_nonsense():
    """Guards against a λ above 1 or an unknown kl_mode being accepted, and a reference model loaded when β = 0
    (invariant 4)."""
    with pytest.raises(ValueError, match="lam_per_token"):
        PPOLossConfig(lam_per_token=1.5)
    with pytest.raises(ValueError, match="kl_mode"):
        PPOLossConfig(kl_mode="both")  # type: ignore[arg-type]
    assert not PPOLossConfig().needs_reference and PPOLossConfig(beta=0.05).needs_reference


def test_micro_batch_losses_sum_to_the_full_batch_loss():
    """Guards the token normaliser: two micro-batches, each divided by the whole batch's token count,
    add up to the full-batch token mean (and so do their gradients)."""
    g = torch.Generator().manual_seed(5)
    old = torch.randn(2, 11, generator=g, dtype=torch.float64)
    logps = old + 0.2 * torch.randn(2, 11, generator=g, dtype=torch.float64)
    old_values = _values(6)
    values = old_values + 0.3 * torch.randn(2, 11, generator=g, dtype=torch.float64)
    advantages, returns = gae(REWARDS, old_values, MASK, 1.0, 0.95)
    advantages = whiten(advantages, MASK)
    cfg = PPOLossConfig()
    full, _ = ppo_loss(logps, old, values, old_values, advantages, returns, MASK, cfg)
    tokens = float(MASK.sum())
    parts = [
        ppo_loss(
            logps[i : i + 1],
            old[i : i + 1],
            values[i : i + 1],
            old_values[i : i + 1],
            advantages[i : i + 1],
            returns[i : i + 1],
            MASK[i : i + 1],
            cfg,
            num_tokens=tokens,
        )[0]
        for i in range(2)
    ]
    assert float(sum(parts)) == pytest.approx(float(full), abs=1e-12)
    # The metrics stay means over each call's own tokens (the loop averages them over micro-batches).
    for i in range(2):
        alone = ppo_loss(
            logps[i : i + 1],
            old[i : i + 1],
            values[i : i + 1],
            old_values[i : i + 1],
            advantages[i : i + 1],
            returns[i : i + 1],
            MASK[i : i + 1],
            cfg,
        )[1]
        shared = ppo_loss(
            logps[i : i + 1],
            old[i : i + 1],
            values[i : i + 1],
            old_values[i : i + 1],
            advantages[i : i + 1],
            returns[i : i + 1],
            MASK[i : i + 1],
            cfg,
            num_tokens=tokens,
        )[1]
        for key in ("loss/policy", "loss/value", "loss/ratio_mean"):
            assert float(shared[key]) == pytest.approx(float(alone[key]), abs=1e-12), key


def test_token_rewards_put_each_turn_reward_on_the_last_token_of_its_span():
    """The spans of MASK's two rows (end exclusive): REWARDS above is exactly what they give."""
    spans = [[(2, 5), (7, 9)], [(1, 3), (6, 7), (8, 11)]]
    out = token_rewards([[0.1, 1.0], [0.1, 0.1, 0.0]], spans, 11)
    torch.testing.assert_close(out, REWARDS, atol=0, rtol=0)
    assert bool((token_rewards([[], [0.5]], [[(2, 5)], [(1, 3)]], 11)[0] == 0).all()), "an untrained row gets no reward"
    with pytest.raises(ValueError, match="2 turn values for 1"):
        token_rewards([[0.1, 1.0]], [[(2, 5)]], 11)
    with pytest.raises(ValueError, match="empty or outside"):
        token_rewards([[1.0]], [[(4, 12)]], 11)


def test_whiten_with_moments_summed_over_shards_equals_whitening_the_whole_batch():
    """Guards multi-process whitening: each process holds some rows; the summed moments of the
    shards must give each shard exactly the whole batch's normalisation."""
    values = _values(7)
    whole = whiten(values, MASK)
    moments = masked_moments(values[:1], MASK[:1]) + masked_moments(values[1:], MASK[1:])
    for rows in (slice(0, 1), slice(1, 2)):
        torch.testing.assert_close(whiten(values[rows], MASK[rows], moments=moments), whole[rows], atol=1e-12, rtol=0)
