"""The audit on start (training/start_audit.py, `audit.on_start`): every GRPO and PPO run checks its
first batch's own episodes before training on them, and stops, naming the first bad token, when
a loss mask or a rendering prefix is wrong. Runs on tiny-qwen3; the passing case and the logged
drift are checked in the end-to-end runs of tests/test_grpo_trainer.py and test_ppo_trainer.py.
"""

from __future__ import annotations

import copy

import pytest
from helpers_training import grpo_cfg, ppo_cfg  # registers the token_parity reward and the ragged_arith env

from agentic_rl.rollout.engine import RolloutEngine
from agentic_rl.training.start_audit import AuditFailed

# ragged_arith asks for a second turn after a first turn of odd length: episodes with an observation.
# It pays that turn 0.2, which these audits leave out of the return on purpose (env_steps at weight 0).
MULTI_TURN = [
    "env.name=ragged_arith",
    "env.options={}",
    "rollout.max_turns=2",
    "rewards=[{name: token_parity}, {name: format, weight: 0.5}, {name: env_steps, weight: 0}]",
]


def _shift_one_mask_onto_an_observation(monkeypatch) -> list[tuple]:
    """Make the engine return one episode whose second turn's loss mask starts one token early, on
    the last token of the observation before it (an off-by-one at a turn boundary: the classic
    silent multi-turn mask bug). Returns [(trajectory, the position made 1)] once it happened."""
    injected: list[tuple] = []
    run = RolloutEngine.run

    def run_with_a_mask_bug(self, *args, **kwargs):
        trajectories = run(self, *args, **kwargs)
        for trajectory in trajectories:
            observations = [span for span in trajectory.spans if span.kind == "observation"]
            if observations and not injected:
                position = observations[0].end - 1
                trajectory.loss_mask[position] = 1
                injected.append((trajectory, position))
        return trajectories

    monkeypatch.setattr(RolloutEngine, "run", run_with_a_mask_bug)
    return injected


@pytest.mark.parametrize("trainer", ["grpo", "ppo"])
def test_a_loss_mask_on_an_observation_token_stops_the_run_naming_that_token(
    tmp_path, monkeypatch, qwen3_tokenizer, trainer
):
    """Guards against training on a token the model did not generate: tool output or template
    text would receive gradient (docs/design.md invariant 2), silently, for the whole run."""
    injected = _shift_one_mask_onto_an_observation(monkeypatch)
    out = tmp_path / "run"
    if trainer == "grpo":
        from agentic_rl.training.grpo import train_grpo as train

        cfg = grpo_cfg(out, "train.steps=2", *MULTI_TURN)
    else:
        from agentic_rl.training.ppo import train_ppo as train

        cfg = ppo_cfg(out, "train.steps=2", *MULTI_TURN)
    with pytest.raises(AuditFailed) as stopped:
        train(cfg)
    assert injected, "no episode had an observation: the test needs one"
    trajectory, position = injected[0]
    token = qwen3_tokenizer.decode([trajectory.input_ids[position]])
    message = str(stopped.value)
    assert "audit on start: FAIL mask" in message and f"task {trajectory.task_id}" in message
    assert f"token {position} ({token!r}) has mask 1 but is not the model's text" in message
    assert f"{position:8d}" in message and "<-- first bad token" in message  # the tokens around it
    assert "audit.on_start: false" in message
    assert not (out / "checkpoints").exists() or not any((out / "checkpoints").iterdir())  # no step was taken
    assert not (out / "final").exists()


def _bound_objective(cfg, tokenizer):
    """A GRPO objective bound to tiny-qwen3 (what the loop does before its first step)."""
    from agentic_rl.models.policy import load_policy
    from agentic_rl.training.common import make_accelerator
    from agentic_rl.training.grpo import GRPO
    from agentic_rl.training.scoring import TokenScorer

    policy, _, _ = load_policy(cfg.model, log=lambda *a: None)
    objective = GRPO(cfg, tokenizer, None)
    objective.bind(TokenScorer(policy), make_accelerator("no", 0))
    return objective


def test_audit_on_start_false_trains_on_the_same_batch(tmp_path, monkeypatch, qwen3_tokenizer):
    """The switch is used: with the audit off, the same mask bug goes unnoticed (which is why it is on)."""
    injected = _shift_one_mask_onto_an_observation(monkeypatch)
    objective = _bound_objective(grpo_cfg(tmp_path / "run", *MULTI_TURN, "audit.on_start=false"), qwen3_tokenizer)
    batch = objective.batch_for(0)
    assert injected and objective.audit.done
    assert batch.tensors.loss_mask.sum() > 0


def test_a_template_that_rewrites_earlier_turns_stops_the_run_at_the_first_differing_token(tmp_path, qwen3_tokenizer):
    """Guards against a chat template that re-renders earlier turns differently (here: a system
    line counting the messages), so the episode's tokens are not what a re-rendering gives."""
    broken = copy.deepcopy(qwen3_tokenizer)
    broken.chat_template = "{{ messages | length }} messages\n" + broken.chat_template
    objective = _bound_objective(grpo_cfg(tmp_path / "run"), broken)
    with pytest.raises(AuditFailed) as stopped:
        objective.batch_for(0)
    message = str(stopped.value)
    assert "audit on start: FAIL prefix" in message
    assert "rewrites the rendering of the first 2; first differing token at position 0" in message
    assert "<-- first difference" in message
