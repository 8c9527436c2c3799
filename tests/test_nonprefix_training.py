"""Training on episodes whose history is not a prefix: each token sequence is a row, with its
episode's advantage (GRPO) or its share of the episode's returns (PPO's GAE across sequences);
an episode of several rows counts once in the per-sequence normalisers."""

from __future__ import annotations

import math

import pytest
import torch
from helpers_references import assert_same_sum, float64_model
from helpers_training import accumulated_gradient, bound, first_batch, grpo_cfg, ppo_cfg  # registers token_parity

from agentic_rl.algorithms.grpo import GRPOLossConfig, grpo_loss
from agentic_rl.algorithms.ppo import gae, sequence_gae
from agentic_rl.training.episodes import episode_token_shares

MEMORY = ["env.name=memory", "env.options={facts: 1, distractors: 2, gap: 0, window: 1}", "rollout.max_turns=3"]


def test_token_shares_weight_each_row_by_its_part_of_the_episode():
    """Guards against an episode split over rows counting once per row: each row's share is its part of the
    episode's policy tokens, an empty row 0."""
    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.float32)
    shares = episode_token_shares(mask, [0, 0, 1, 2])  # episode 0 spans rows 0-1 (2 + 1 tokens)
    assert shares.tolist() == pytest.approx([2 / 3, 1 / 3, 1.0, 0.0])


def test_grpo_loss_counts_an_episode_of_two_sequences_as_one_episode():
    """Guards against an episode of several sequences weighing more than one of a single sequence
    (and against per-rank normalisers that differ with the number of rows under DDP): with the
    token shares as weights and share = rows / episodes, the loss is the paper's per-episode mean.

    Hand-computed, A = 1, ratios 1.1, 0.9 (sequence 0) and 1.05 (sequence 1), unclipped:
    the episode's token mean is -(1.1 + 0.9 + 1.05) / 3 = -1.016667."""
    cfg = GRPOLossConfig(beta=0.0)
    log_ratio = torch.log(torch.tensor([[1.1, 0.9], [1.05, 1.0]], dtype=torch.float64))  # (2, 2)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    old = torch.zeros(2, 2, dtype=torch.float64)
    weights = episode_token_shares(mask, [0, 0]).double()
    rows_loss, _ = grpo_loss(log_ratio, old, torch.ones(2, dtype=torch.float64), mask, cfg, sequence_weights=weights)
    assert float(rows_loss * 2 / 1) == pytest.approx(-3.05 / 3, abs=1e-7)  # × share = 2 rows / 1 episode
    concatenated = torch.log(torch.tensor([[1.1, 0.9, 1.05]], dtype=torch.float64))
    one_row, _ = grpo_loss(
        concatenated,
        torch.zeros(1, 3, dtype=torch.float64),
        torch.ones(1, dtype=torch.float64),
        torch.ones(1, 3, dtype=torch.float64),
        cfg,
    )
    assert float(one_row) == pytest.approx(-3.05 / 3, abs=1e-12)
    unweighted, _ = grpo_loss(log_ratio, old, torch.ones(2, dtype=torch.float64), mask, cfg)
    assert float(unweighted) * 2 != pytest.approx(-3.05 / 3)  # rows as sequences: (-1.0 - 1.05) = -2.05
    with pytest.raises(ValueError, match="only with loss_type 'grpo'"):
        grpo_loss(
            log_ratio, old, torch.ones(2), mask, GRPOLossConfig(beta=0.0, loss_type="dapo"), sequence_weights=weights
        )


def test_gae_across_sequences_equals_gae_over_the_concatenated_episode():
    """Guards against sequences whose return stops at the sequence's end (the outcome reward of
    the last sequence would never reach the first): bootstrapping from the next sequence's first
    policy token gives exactly GAE over the whole episode's policy tokens."""
    generator = torch.Generator().manual_seed(0)
    #              P  A  A  O  A | P  P  A  A        episode 0: two sequences; episode 1: one
    mask0 = torch.tensor([0, 1, 1, 0, 1], dtype=torch.float64)
    mask1 = torch.tensor([0, 0, 1, 1, 0], dtype=torch.float64)
    mask2 = torch.tensor([0, 1, 1, 1, 1], dtype=torch.float64)
    masks = torch.stack([mask0, mask1, mask2])  # (3, 5)
    rewards = torch.randn(3, 5, generator=generator, dtype=torch.float64) * masks
    values = torch.randn(3, 5, generator=generator, dtype=torch.float64)
    advantages, returns = sequence_gae(rewards, values, masks, 0.9, 0.8, [0, 0, 1])
    whole_adv, whole_ret = gae(
        torch.cat([rewards[0], rewards[1]])[None],
        torch.cat([values[0], values[1]])[None],
        torch.cat([mask0, mask1])[None],
        0.9,
        0.8,
    )  # (1, 10)
    assert torch.allclose(torch.cat([advantages[0], advantages[1]]), whole_adv[0], atol=1e-12)
    assert torch.allclose(torch.cat([returns[0], returns[1]]), whole_ret[0], atol=1e-12)
    alone, _ = gae(rewards[2:], values[2:], masks[2:], 0.9, 0.8)
    assert torch.allclose(advantages[2], alone[0], atol=1e-12)
    cut, _ = gae(rewards[:1], values[:1], masks[:1], 0.9, 0.8)  # without the bootstrap: a different answer
    assert not torch.allclose(cut[0], advantages[0])


def test_grpo_trains_each_sequence_of_a_memory_episode_with_its_episodes_advantage(tmp_path):
    """Guards against rows that lose their episode's advantage, failed sequences that are trained,
    or a loss that depends on the micro-batch size once episodes span several rows."""
    cfg = grpo_cfg(tmp_path, *MEMORY, "old_logprobs=sampling", "loss.beta=0.0", "micro_batch_size=8")
    model, objective, batch = first_batch(cfg)
    sequences_per_episode = batch.metrics["rollout/sequences_per_episode"]
    assert (
        sequences_per_episode == 2
        and batch.episodes == 4
        and len(batch.trajectories) == 8 == batch.tensors.input_ids.shape[0]
    )
    for seq in batch.trajectories:  # the window dropped turn 1: every later sequence starts with a re-rendered context
        seq.check()
        assert seq.num_policy_tokens == int(batch.tensors.loss_mask[batch.trajectories.index(seq)].sum())
    per_episode = batch.advantages[:, 0].view(4, 2)  # rows of one episode are consecutive, oldest first
    assert torch.equal(per_episode[:, 0], per_episode[:, 1]), "every row carries its episode's advantage"
    assert per_episode[:, 0].view(2, 2).sum(-1).abs().max() < 1e-5 and per_episode.abs().sum() > 0  # G = 2 groups
    assert batch.row_weights is not None and torch.allclose(batch.row_weights.view(4, 2).sum(-1), torch.ones(4))
    float64_model(model)  # one sum in two orders: compared in float64, whatever the CPU (assert_same_sum)
    whole, micros = accumulated_gradient(model, objective, batch)
    assert len(micros) == 1 and math.isclose(micros[0].share, 8 / 4)
    objective.cfg = grpo_cfg(tmp_path, *MEMORY, "old_logprobs=sampling", "loss.beta=0.0", "micro_batch_size=3")
    split, micros = accumulated_gradient(model, objective, batch)
    assert len(micros) == 3 and sum(m.share for m in micros) == pytest.approx(2.0)
    assert any(g.abs().sum() > 0 for g in whole.values())
    assert_same_sum(split, whole)


def test_ppo_runs_gae_across_the_sequences_of_a_memory_episode(tmp_path):
    """Guards against PPO rows whose rewards or values ignore the episode's other sequences."""
    model, objective = bound(ppo_cfg(tmp_path, *MEMORY, "rollout.group_size=1"))
    batch = objective.batch_for(0)
    assert len(batch.trajectories) == 8 and batch.tensors.input_ids.shape[0] == 8
    mask = batch.tensors.loss_mask.bool()
    # γ = λ = 1: the value target at every policy token is the episode's reward-to-go, all of it on the
    # last sequence's last turn here; without the bootstrap the first sequence's targets would be 0
    assert (
        objective.cfg.loss.gamma_per_token == objective.cfg.loss.lam_per_token == 1.0 and objective.cfg.loss.beta == 0.0
    )
    for episode in range(4):
        targets = torch.cat(
            [batch.returns[2 * episode][mask[2 * episode]], batch.returns[2 * episode + 1][mask[2 * episode + 1]]]
        )
        assert torch.allclose(targets, targets[-1].expand_as(targets), atol=1e-5) and targets[-1] != 0
    for micro in objective.micro_batches(batch):
        loss, metrics = objective.loss(model, micro)
        assert torch.isfinite(loss) and all(math.isfinite(v) for v in metrics.values())
