"""Sampler/trainer mismatch correction (algorithms/rollout_correction.py) against float64 references
computed by hand here, its place in the GRPO and PPO losses, its config, and the mismatch it
measures in real runs on tiny-qwen3 (zero with float32 on both sides).

The reference inputs put large, asymmetric log-probs on mask-0 positions (prompt, observation and
padding tokens), so a weight that reads them, in a token weight, a sequence mean or a statistic,
gives visibly different numbers.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from agentic_rl.algorithms.grpo import GRPOLossConfig, grpo_loss
from agentic_rl.algorithms.ppo import PPOLossConfig, ppo_loss
from agentic_rl.algorithms.rollout_correction import RolloutCorrectionConfig, rollout_correction
from agentic_rl.config import ConfigError, load_config
from agentic_rl.config_docs import describe

# Two rows of 5 positions. Row 0: a prompt token, three trained tokens, an observation token.
# Row 1: two trained tokens, then padding. Off the mask the log-probs are garbage: the sampler's
# record is 0.0 there (the engine writes 0), π_old something else entirely.
OLD = [[-9.0, -0.2, -1.0, -2.5, 4.0], [-0.7, -1.6, 30.0, -30.0, 7.0]]
SAMPLER = [[0.0, -0.9, -0.8, -0.4, 0.0], [-0.5, -1.9, 0.0, 0.0, 0.0]]
MASK = [[0, 1, 1, 1, 0], [1, 1, 0, 0, 0]]


def _tensors():
    return (
        torch.tensor(OLD, dtype=torch.float64),
        torch.tensor(SAMPLER, dtype=torch.float64),
        torch.tensor(MASK, dtype=torch.float64),
    )


def _token_weights() -> list[list[float | None]]:
    """w = π_old/π_sampler = exp(log π_old − log π_sampler) on trained tokens, None elsewhere."""
    return [
        [math.exp(o - s) if m else None for o, s, m in zip(orow, srow, mrow)]
        for orow, srow, mrow in zip(OLD, SAMPLER, MASK)
    ]


def _trained(rows: list[list[float | None]]) -> list[float]:
    return [w for row in rows for w in row if w is not None]


def _sequence_weights() -> list[float]:
    """Per row, the geometric mean of its trained tokens' weights: exp(mean of the log-ratios)."""
    out = []
    for orow, srow, mrow in zip(OLD, SAMPLER, MASK):
        logs = [o - s for o, s, m in zip(orow, srow, mrow) if m]
        out.append(math.exp(sum(logs) / len(logs)))
    return out


def _close(actual: torch.Tensor, expected: list) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=0.0)


def test_the_reference_weights_cross_the_cap_and_the_band_in_both_directions():
    """The inputs must exercise what the breaks would change: weights above 2 and below 0.5, and
    a weight whose inverse differs from it."""
    weights = _trained(_token_weights())
    assert [round(w, 4) for w in weights] == [2.0138, 0.8187, 0.1225, 0.8187, 1.3499]
    assert max(weights) > 2.0 and min(weights) < 0.5


def test_token_tis_weights_equal_the_float64_reference():
    """Guards against the weight's direction (π_sampler/π_old is the inverse), a missing
    truncation, and weights read off mask-0 positions (they must be 1 there)."""
    old, sampler, mask = _tensors()
    weights, metrics = rollout_correction(old, sampler, mask, RolloutCorrectionConfig(mode="tis", cap=2.0))
    expected = [[1.0 if w is None else min(w, 2.0) for w in row] for row in _token_weights()]
    assert weights.shape == (2, 5) and not weights.requires_grad
    _close(weights, expected)
    trained = _trained(_token_weights())
    assert float(metrics["rollout/is_weight_mean"]) == pytest.approx(sum(trained) / 5, rel=1e-12)
    assert float(metrics["rollout/is_weight_max"]) == pytest.approx(max(trained), rel=1e-12)
    assert float(metrics["rollout/is_truncated_frac"]) == pytest.approx(1 / 5)
    k3 = [w - 1 - math.log(w) for w in trained]  # KL(π_sampler ‖ π_old), sampled from π_sampler
    assert float(metrics["rollout/mismatch_kl"]) == pytest.approx(sum(k3) / 5, rel=1e-12)
    assert "rollout/is_masked_frac" not in metrics


def test_token_mis_masks_tokens_outside_the_band_and_keeps_the_rest_weighted():
    """Guards against MIS masking by the inverse weight, masking nothing, or counting mask-0
    positions in its masked share (padding with garbage log-probs would all be 'outside')."""
    old, sampler, mask = _tensors()
    weights, metrics = rollout_correction(old, sampler, mask, RolloutCorrectionConfig(mode="mis", low=0.5, high=2.0))
    expected = [[1.0 if w is None else (w if 0.5 <= w <= 2.0 else 0.0) for w in row] for row in _token_weights()]
    _close(weights, expected)
    assert float(metrics["rollout/is_masked_frac"]) == pytest.approx(2 / 5)  # 2.0138 and 0.1225
    assert "rollout/is_truncated_frac" not in metrics


def test_sequence_weights_are_the_geometric_mean_over_trained_tokens_only():
    """Guards against a sequence weight that averages over padding or observation tokens (row 1's
    padding holds log-ratios of +30 and −30), that is the product instead of the geometric mean,
    or that is not truncated."""
    old, sampler, mask = _tensors()
    per_row = _sequence_weights()
    assert [round(w, 4) for w in per_row] == [0.5866, 1.0513]
    weights, metrics = rollout_correction(
        old, sampler, mask, RolloutCorrectionConfig(mode="tis", level="sequence", cap=1.02)
    )
    assert weights.shape == (2, 1)
    _close(weights[:, 0], [min(w, 1.02) for w in per_row])
    assert float(metrics["rollout/is_weight_mean"]) == pytest.approx(sum(per_row) / 2, rel=1e-12)
    assert float(metrics["rollout/is_weight_max"]) == pytest.approx(max(per_row), rel=1e-12)
    assert float(metrics["rollout/is_truncated_frac"]) == pytest.approx(1 / 2)
    trained = _trained(_token_weights())  # the KL stays per token at either level
    assert float(metrics["rollout/mismatch_kl"]) == pytest.approx(
        sum(w - 1 - math.log(w) for w in trained) / 5, rel=1e-12
    )


def test_sequence_mis_masks_a_whole_row():
    """Guards against sequence-level MIS that masks single tokens, or misses a row outside the band."""
    old, sampler, mask = _tensors()
    weights, metrics = rollout_correction(
        old, sampler, mask, RolloutCorrectionConfig(mode="mis", level="sequence", low=0.7)
    )
    _close(weights[:, 0], [0.0, _sequence_weights()[1]])  # 0.5866 < 0.7
    assert float(metrics["rollout/is_masked_frac"]) == pytest.approx(1 / 2)


def test_same_numerics_give_weights_of_exactly_one_and_the_loss_is_unchanged():
    """Guards against a correction that is not a no-op where sampler and trainer agree
    (old_logprobs: sampling, where π_old is the sampler's record)."""
    torch.manual_seed(0)
    logps = (-torch.rand(3, 6) * 3).requires_grad_()
    record = logps.detach().clone()
    mask = torch.tensor([[0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [0, 0, 1, 0, 0, 0]], dtype=torch.float32)
    advantages = torch.tensor([0.5, -1.0, 2.0])
    cfg = GRPOLossConfig(beta=0.0)
    for correction in (RolloutCorrectionConfig(mode="tis"), RolloutCorrectionConfig(mode="mis", level="sequence")):
        weights, metrics = rollout_correction(record, record, mask, correction)
        assert bool((weights == 1.0).all())
        assert float(metrics["rollout/mismatch_kl"]) == 0.0 and float(metrics["rollout/is_weight_max"]) == 1.0
        plain, _ = grpo_loss(logps, record, advantages, mask, cfg)
        weighted, _ = grpo_loss(logps, record, advantages, mask, cfg, is_weights=weights)
        assert float(weighted.detach()) == float(plain.detach())
        assert torch.equal(torch.autograd.grad(weighted, logps)[0], torch.autograd.grad(plain, logps)[0])
    assert rollout_correction(record, record, mask, RolloutCorrectionConfig())[0] is None  # off: no weight at all


def _surrogate(r: float, a: float, eps: float = 0.2) -> float:
    """−min(r·A, clip(r, 1 − ε, 1 + ε)·A)."""
    return -min(r * a, min(max(r, 1 - eps), 1 + eps) * a)


def test_grpo_loss_multiplies_the_clipped_surrogate_by_the_weight():
    """Guards against the weight entering the clip (w·r clipped) instead of multiplying the clipped
    surrogate, or reaching the KL term. Float64 reference of loss_type grpo with β > 0."""
    old, sampler, mask = _tensors()
    logps = torch.tensor(
        [[-9.0, -0.5, -0.7, -2.9, 4.0], [-0.3, -1.6, 0.0, 0.0, 0.0]], dtype=torch.float64, requires_grad=True
    )
    ref = torch.tensor([[0.0, -0.4, -0.9, -2.0, 0.0], [-0.6, -1.5, 0.0, 0.0, 0.0]], dtype=torch.float64)
    advantages = torch.tensor([1.5, -0.8], dtype=torch.float64)
    weights, _ = rollout_correction(old, sampler, mask, RolloutCorrectionConfig(mode="tis", cap=2.0))
    loss, _ = grpo_loss(logps, old, advantages, mask, GRPOLossConfig(beta=0.1), ref, is_weights=weights)
    rows, values = [], logps.detach()
    for row in range(2):
        terms = []
        for t in range(5):
            if not MASK[row][t]:
                continue
            lp, o, rf = float(values[row, t]), OLD[row][t], float(ref[row, t])
            w = min(math.exp(o - SAMPLER[row][t]), 2.0)
            k3 = math.exp(rf - lp) - (rf - lp) - 1
            terms.append(w * _surrogate(math.exp(lp - o), float(advantages[row])) + 0.1 * k3)
        rows.append(sum(terms) / len(terms))
    assert float(loss.detach()) == pytest.approx(sum(rows) / 2, rel=1e-12)
    # token (0, 2) takes the clipped branch (r = 1.35 > 1.2 with A > 0) with w = 0.82: w·clip(r)·A
    # there, where clip(w·r)·A would be 1.66, not 1.47
    assert math.exp(float(values[0, 2]) - OLD[0][2]) > 1.2 and _token_weights()[0][2] < 0.9


def test_ppo_loss_multiplies_the_clipped_surrogate_by_the_weight():
    """The same for PPO's token-mean policy loss; the value loss is not weighted."""
    old, sampler, mask = _tensors()
    logps = torch.tensor([[-9.0, -0.5, -0.7, -2.9, 4.0], [-0.3, -1.6, 0.0, 0.0, 0.0]], dtype=torch.float64)
    advantages = torch.tensor([[0.0, 1.0, -0.5, 2.0, 0.0], [-1.0, 0.3, 0.0, 0.0, 0.0]], dtype=torch.float64)
    values = torch.zeros(2, 5, dtype=torch.float64)
    weights, _ = rollout_correction(old, sampler, mask, RolloutCorrectionConfig(mode="mis"))
    cfg = PPOLossConfig()
    _, metrics = ppo_loss(logps, old, values, values, advantages, advantages, mask, cfg, is_weights=weights)
    expected = []
    for row in range(2):
        for t in range(5):
            if MASK[row][t]:
                w = math.exp(OLD[row][t] - SAMPLER[row][t])
                w = w if 0.5 <= w <= 2.0 else 0.0
                expected.append(w * _surrogate(math.exp(float(logps[row, t]) - OLD[row][t]), float(advantages[row, t])))
    assert float(metrics["loss/policy"]) == pytest.approx(sum(expected) / len(expected), rel=1e-12)
    _, unweighted = ppo_loss(logps, old, values, values, advantages, advantages, mask, cfg)
    assert float(metrics["loss/value"]) == float(unweighted["loss/value"])


def test_the_losses_refuse_weights_with_a_gradient_or_the_wrong_shape():
    """Guards against importance weights that carry a gradient (the correction would train the sampler ratio) or
    broadcast from the wrong shape."""
    logps = torch.zeros(2, 5, requires_grad=True)
    mask = torch.ones(2, 5)
    with pytest.raises(ValueError, match="is_weights must be detached"):
        grpo_loss(
            logps,
            logps.detach(),
            torch.zeros(2),
            mask,
            GRPOLossConfig(beta=0.0),
            is_weights=torch.ones(2, 5, requires_grad=True),
        )
    with pytest.raises(ValueError, match="is_weights must be detached"):
        grpo_loss(logps, logps.detach(), torch.zeros(2), mask, GRPOLossConfig(beta=0.0), is_weights=torch.ones(5))


# ---------------------------------------------------------------------- the config


@pytest.mark.parametrize(
    "settings, fragment",
    [
        ({"mode": "weird"}, "RolloutCorrectionConfig: 'mode' must be one of ['off', 'tis', 'mis'], got 'weird'"),
        ({"level": "episode"}, "RolloutCorrectionConfig: 'level' must be one of ['token', 'sequence'], got 'episode'"),
        ({"mode": "tis", "cap": 0.5}, "rollout_correction.cap=0.5 must be >= 1"),
        ({"mode": "tis", "cap": float("inf")}, "RolloutCorrectionConfig: 'cap' must be a finite number, got inf"),
        (
            {"mode": "mis", "cap": 3.0},
            "rollout_correction.cap=3.0 is only used by mode tis (mode is 'mis'); remove it, or set rollout_correction.mode: tis",
        ),
        ({"mode": "tis", "high": 3.0}, "rollout_correction.high=3.0 is only used by mode mis"),
        ({"mode": "mis", "low": 1.0}, "rollout_correction.low=1.0 must be in [0, 1)"),
        ({"mode": "mis", "high": 0.9}, "rollout_correction.high=0.9 must be > 1"),
    ],
)
def test_bad_settings_are_refused_naming_the_key_the_value_and_the_fix(settings, fragment):
    """Guards against rollout_correction settings that are invalid or unused by the chosen mode being accepted
    (invariant 6); each error names key, value and fix."""
    with pytest.raises(ValueError, match=re.escape(fragment)):
        RolloutCorrectionConfig(**settings)


@pytest.mark.parametrize("command", ["grpo", "ppo"])
def test_every_new_key_is_wired_documented_and_shown_by_agentic_rl_config(command):
    """Guards against a setting that is silently ignored, or shown without its documentation."""
    if command == "grpo":
        from agentic_rl.training.grpo_config import GRPOConfig as cls
    else:
        from agentic_rl.training.ppo_config import PPOConfig as cls
    lines = {line.split(" ")[0]: line for line in describe(cls)}
    for key in (
        "rollout_correction.mode",
        "rollout_correction.level",
        "rollout_correction.cap",
        "rollout_correction.low",
        "rollout_correction.high",
        "audit.on_start",
    ):
        assert key in lines and len(lines[key].split("): ", 1)[1]) > 40, key
    assert "multiplies the PPO-clipped surrogate" in lines["rollout_correction.mode"]
    assert "μ updates" in lines["rollout_correction.mode"] and "guided" in lines["rollout_correction.mode"]
    cfg = load_config(
        cls,
        None,
        [
            "rollout_correction.mode=mis",
            "rollout_correction.level=sequence",
            "rollout_correction.low=0.2",
            "audit.on_start=false",
        ],
    )
    assert cfg.rollout_correction.band == (0.2, 2.0) and cfg.audit.on_start is False
    with pytest.raises(ConfigError, match="rollout_correction.cap=0.5 must be >= 1"):
        load_config(cls, None, ["rollout_correction.mode=tis", "rollout_correction.cap=0.5"])
    with pytest.raises(ConfigError, match="rollout_correction.clip"):
        load_config(cls, None, ["rollout_correction.clip=2"])


def test_the_trl_backend_refuses_a_correction_it_cannot_apply():
    """TRL generates with the training weights: a correction there would be silently unused."""
    from agentic_rl.integrations.trl_backend import TRLConfigError, _check_unmappable
    from agentic_rl.training.grpo_config import GRPOConfig

    cfg = load_config(GRPOConfig, None, ["backend=trl", "rollout_correction.mode=tis"])
    with pytest.raises(TRLConfigError, match="rollout_correction.mode=tis"):
        _check_unmappable(cfg)


# ---------------------------------------------------------------------- real runs on tiny-qwen3


def test_a_float32_run_logs_no_mismatch_and_one_weight_for_all_mu_updates(tmp_path):
    """Float32 decoding against a float32 trainer (π_old re-scored): the sampler and π_old differ
    by rounding only, so the mismatch reads ~0 and the weights ~1. Guards against a mismatch
    measured where there is none (a wrong log-prob alignment reads as a large KL), and against
    weights that move between the μ = 2 updates of one batch (π_old is fixed for the batch)."""
    from helpers_training import grpo_cfg

    from agentic_rl.training.grpo import train_grpo

    cfg = grpo_cfg(
        tmp_path / "run",
        "train.steps=2",
        "updates_per_batch=2",
        "old_logprobs=recompute",
        "loss.beta=0.0",
        "rollout_correction.mode=tis",
    )
    rows = train_grpo(cfg)["history"]
    for row in rows:
        assert 0.0 <= row["rollout/mismatch_kl"] < 1e-9, row
        assert row["rollout/is_weight_mean"] == pytest.approx(1.0, abs=1e-4)
        assert row["rollout/is_weight_max"] == pytest.approx(1.0, abs=1e-3)
        assert row["rollout/is_truncated_frac"] == 0.0
    keys = ("rollout/mismatch_kl", "rollout/is_weight_mean", "rollout/is_weight_max")
    assert [rows[0][k] for k in keys] == [rows[1][k] for k in keys]  # the same batch, the same π_old: the same w
    assert rows[1]["rollout/staleness"] == 1.0


def test_guided_demonstration_rows_get_weight_one_and_stay_out_of_the_mismatch(tmp_path):
    """Guided groups (guidance.enabled) put an oracle demonstration that no sampler drew into each
    failing group: its tokens have no sampler log-probs, so they must get w = 1 and count in none
    of the mismatch statistics, while the sampled rows beside them in the same micro-batch are
    corrected as usual (float32 both sides: w ~ 1, KL ~ 0). Guards against the demonstrations'
    empty sampler record (log-prob 0) read as a mismatch: w = π_old(demo) / 1, far below 1."""
    from helpers_training import first_batch, grpo_cfg

    model, objective, batch = first_batch(
        grpo_cfg(
            tmp_path,
            "rewards=[{name: accuracy}]",
            "loss.beta=0",
            "guidance.enabled=true",
            "old_logprobs=recompute",
            "rollout_correction.mode=tis",
        )
    )
    assert batch.off_policy.any() and not batch.off_policy.all()
    for micro in objective.micro_batches(batch):
        assert batch.off_policy[micro.rows].any()  # every micro-batch holds a demonstration beside sampled rows
        _, metrics = objective.loss(model, micro)
        assert 0.0 <= metrics["rollout/mismatch_kl"] < 1e-9
        assert metrics["rollout/is_weight_mean"] == pytest.approx(1.0, abs=1e-4)
        assert metrics["loss/ratio_mean"] == pytest.approx(1.0)


def test_a_bfloat16_rollout_run_measures_the_mismatch_and_truncates_weights(tmp_path):
    """bf16 decoding against a float32 trainer (PPO, π_old = π_θ.detach()): the mismatch is
    measured (well above float32's ~1e-13) and, with a cap of 1, every weight above 1 is cut.
    Guards against a correction that is configured but never reaches the PPO loss."""
    from helpers_training import ppo_cfg

    from agentic_rl.training.ppo import train_ppo

    cfg = ppo_cfg(
        tmp_path / "run",
        "train.steps=1",
        "rollout.dtype=bfloat16",
        "old_logprobs=detach",
        "rollout_correction.mode=tis",
        "rollout_correction.cap=1.0",
    )
    row = train_ppo(cfg)["history"][0]  # bf16 may be slow on this CPU: tiny-qwen3 does not mind
    assert row["rollout/mismatch_kl"] > 1e-9
    assert row["rollout/is_weight_max"] > 1.0 and row["rollout/is_weight_mean"] != 1.0
    assert 0.0 < row["rollout/is_truncated_frac"] < 1.0
