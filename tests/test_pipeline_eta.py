"""The pipeline's time-left estimate scales what its finished stages measured (pipeline_eta.py)."""

from pathlib import Path

import pytest

from agentic_rl.config import load_config
from agentic_rl.pipeline import PipelineConfig
from agentic_rl.pipeline_eta import estimate_seconds, minutes, progress_line

DEMO = Path(__file__).parent.parent / "configs" / "demo.yaml"
# SFT: 28 steps in 280 s of training, 300 s in all (20 s of loading and saving); one evaluation of
# 100 + 256 greedy episodes in 120 s.
DONE = {
    "sft": {"seconds": 300.0, "train_seconds": 280.0, "steps": 28},
    "eval_sft": {"seconds": 120.0, "evals": {"seen": {"n": 100, "k": 1}, "new": {"n": 256, "k": 1}}},
}


def _cfg(*overrides: str) -> PipelineConfig:
    return load_config(PipelineConfig, DEMO, overrides=list(overrides))


def test_an_rl_stage_is_estimated_from_the_sft_step_and_the_evaluation_episode():
    """Guards against an estimate that ignores the RL stage's batch, rounds or updates."""
    cfg = _cfg(
        "grpo.rollout.batch_size=32",
        "grpo.rollout.group_size=8",
        "grpo.train.steps=12",
        "sft.batch_size=8",
        "grpo.selection.dynamic_sampling=true",
        "grpo.updates_per_batch=1",
        "grpo.old_logprobs=detach",
    )
    rollout = 32 * (120.0 / 356) * 1.5  # episodes x seconds per evaluated episode x the dynamic-sampling round
    training = (
        1 * 32 * (280.0 / 28) / 8 * 0.65
    )  # updates x episodes x SFT seconds per demonstration x the share trained
    assert estimate_seconds(cfg, "grpo", DONE) == pytest.approx(12 * (rollout + training) + 20.0)
    mu2 = _cfg(
        "grpo.rollout.batch_size=32",
        "grpo.rollout.group_size=8",
        "grpo.train.steps=12",
        "sft.batch_size=8",
        "grpo.selection.dynamic_sampling=false",
        "grpo.selection.max_rounds=2",
        "grpo.updates_per_batch=2",
        "grpo.old_logprobs=recompute",
    )  # max_rounds back to its default: without dynamic sampling it is unused
    # train.steps counts updates: 12 steps at μ = 2 are 6 rollout batches and 12 updates (it once
    # counted 12 batches x 2), each on the 65% of the batch in groups with reward variance. π_old
    # (recompute) comes from the first update's forward, so nothing is charged for it (it once
    # charged a re-scoring pass, a third of the 40 s forward/backward, per batch).
    assert estimate_seconds(mu2, "grpo", DONE) == pytest.approx(6 * (32 * 120.0 / 356) + 12 * 40.0 * 0.65 + 20.0)
    with_beta = _cfg(
        "grpo.rollout.batch_size=32",
        "grpo.rollout.group_size=8",
        "grpo.train.steps=12",
        "sft.batch_size=8",
        "grpo.selection.dynamic_sampling=true",
        "grpo.updates_per_batch=1",
        "grpo.old_logprobs=detach",
        "grpo.loss.beta=0.04",
    )
    assert estimate_seconds(with_beta, "grpo", DONE) == pytest.approx(
        12 * (rollout + training / 0.65) + 20.0
    )  # β > 0 trains every episode


def test_evaluations_and_the_control_follow_their_measured_stages():
    """Guards against ETAs for stages whose inputs were not measured yet: evaluations and the control follow
    their measured stages, else None."""
    cfg = _cfg("control.enabled=true")
    assert estimate_seconds(cfg, "eval_grpo", DONE) == 120.0
    assert estimate_seconds(cfg, "control", DONE) is None  # matched on GRPO's time, which has not run
    assert estimate_seconds(cfg, "control", {**DONE, "grpo": {"train_seconds": 400.0}}) == 420.0
    assert estimate_seconds(_cfg("control.enabled=true", "control.steps=30"), "control", DONE) == 30 * 10.0 + 20.0
    assert estimate_seconds(cfg, "grpo", {}) is None and estimate_seconds(cfg, "eval_sft", {}) is None


def test_an_evaluation_is_estimated_from_the_episodes_its_stage_decodes():
    """Guards against charging every stage for an evaluation that runs on one model only (`stages`),
    and against ignoring the k samples of a pass@k evaluation."""
    cfg = _cfg(
        "evals=[{label: seen, n: 100}, {label: new, n: 256}, {label: room, n: 50, k: 8, rollout: {sampling: {temperature: 1.0}}, stages: [sft]}]"
    )
    per_episode = 120.0 / 356  # the last evaluation: 356 greedy episodes in 120 s
    assert estimate_seconds(cfg, "eval_grpo", DONE) == pytest.approx(120.0)
    assert estimate_seconds(cfg, "eval_sft", DONE) == pytest.approx(
        (356 + 50 * 9) * per_episode
    )  # 50 greedy + 400 sampled


def test_the_progress_line_names_every_stage_left_and_which_cannot_be_estimated_yet():
    """Guards against a progress line that hides the stages it cannot estimate or rounds 59.6 s to '0 min 60 s'."""
    cfg = _cfg()
    line = progress_line(
        cfg,
        "eval_base",
        65.0,
        70.0,
        {"eval_base": {"seconds": 65.0, "evals": DONE["eval_sft"]["evals"]}},
        ["sft", "eval_sft", "grpo", "eval_grpo"],
    )
    assert line == (
        "[pipeline] eval_base: done in 1 min 05 s (elapsed 1 min 10 s); at least 2 min 10 s left "
        "(sft not estimable yet, eval_sft ~1 min 05 s, grpo not estimable yet, eval_grpo ~1 min 05 s)"
    )
    assert (
        progress_line(cfg, "eval_grpo", 5.0, 999.0, DONE, [])
        == "[pipeline] eval_grpo: done in 5 s (elapsed 16 min 39 s)"
    )
    assert minutes(59.6) == "1 min 00 s"


def test_a_line_with_nothing_estimable_says_so_instead_of_zero_seconds_left():
    """Guards against "at least 0 s left" after the demo's SFT stage (no evaluation has run yet, so
    nothing after it can be scaled), which reads as "done" with ~25 minutes to go (session 17's demo)."""
    cfg = _cfg()
    line = progress_line(
        cfg,
        "sft",
        410.0,
        414.0,
        {"sft": {"seconds": 410.0, "train_seconds": 400.0, "steps": 72}},
        ["eval_sft", "grpo", "eval_grpo"],
    )
    assert line == (
        "[pipeline] sft: done in 6 min 50 s (elapsed 6 min 54 s); time left not estimable yet "
        "(eval_sft not estimable yet, grpo not estimable yet, eval_grpo not estimable yet)"
    )
