"""Each reward formula against hand-computed values, and the composer's bookkeeping."""

import json
import re

import pytest

from agentic_rl.rewards import RewardComposer, RewardSpec
from agentic_rl.rewards.terms import (
    accuracy,
    env_steps,
    format_reward,
    length_penalty,
    solution_steps,
    step_bonus,
    tool_use,
)
from agentic_rl.rollout.trajectory import Span, Trajectory


def make_traj(
    policy_tokens=10, correct=True, text="Step 1: 2+3\nStep 2: 5*4\nFinal Answer: 20", info=None, turn_rewards=()
):
    prompt = 5
    ids = list(range(prompt + policy_tokens))
    mask = [0] * prompt + [1] * policy_tokens
    spans = [Span("prompt", 0, prompt), Span("policy", prompt, prompt + policy_tokens)]
    base_info = {"correct": correct, "format_ok": True, "tool_calls": 0, "tool_errors": 0}
    base_info.update(info or {})
    return Trajectory(
        ids,
        mask,
        [0.0] * len(ids),
        spans,
        turn_rewards=list(turn_rewards),
        messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": text}],
        info=base_info,
    )


def test_accuracy_and_format():
    """Guards against the accuracy and format rewards reading the wrong info field: 1 for a correct answer, 0
    otherwise, 0 when format_ok is False."""
    assert accuracy(make_traj(correct=True)) == 1.0
    assert accuracy(make_traj(correct=False)) == 0.0
    assert format_reward(make_traj(info={"format_ok": False})) == 0.0


def test_length_penalty_formula():
    """r = r_acc − α·max(0, l − l_target): 300 tokens, target 256, α = 0.01 → 1 − 0.44 = 0.56."""
    traj = make_traj(policy_tokens=300)
    assert length_penalty(traj, alpha=0.01, target=256) == pytest.approx(-0.44)
    assert length_penalty(make_traj(policy_tokens=100), alpha=0.01, target=256) == 0.0
    composer = RewardComposer(
        [RewardSpec("accuracy"), RewardSpec("length_penalty", params={"alpha": 0.01, "target": 256})]
    )
    assert composer([traj]) == [pytest.approx(0.56)]


def test_step_bonus_counts_markers_with_cap_only_when_correct():
    """Guards against paying for `Step` lines on wrong answers, which rewards padding."""
    text = "\n".join(f"Step {k}: x" for k in range(1, 8)) + "\nFinal Answer: 3"
    assert step_bonus(make_traj(text=text), beta=0.1, cap=5) == pytest.approx(0.5)
    assert step_bonus(make_traj(text=text, correct=False), beta=0.1, cap=5) == 0.0
    assert step_bonus(make_traj(), beta=0.1, cap=5) == pytest.approx(0.2)
    assert step_bonus(make_traj(text="I think Step 1: is mid-line"), beta=0.1) == 0.0


def test_tool_use_share():
    """Guards against the tool reward paying for failed calls: it is the share of calls without an error, and
    `no_calls` when there were none."""
    assert tool_use(make_traj(info={"tool_calls": 4, "tool_errors": 1})) == pytest.approx(0.75)
    assert tool_use(make_traj(info={"tool_calls": 0}), no_calls=0.0) == 0.0


def test_solution_steps_share():
    """Guards against the step reward dividing by zero or paying when the task lists no reference steps."""
    assert solution_steps(make_traj(info={"solution_steps_matched": 1, "solution_steps_total": 4})) == 0.25
    assert solution_steps(make_traj(info={"solution_steps_matched": 3, "solution_steps_total": 3})) == 1.0
    assert solution_steps(make_traj()) == 0.0  # the task lists no reference steps


def test_env_steps_discounted_return():
    """Σ γ^t r_t with γ = 0.9 over [0.1, 0.1, 1.0] = 0.1 + 0.09 + 0.81 = 1.0."""
    assert env_steps(make_traj(turn_rewards=[0.1, 0.1, 1.0]), gamma=0.9) == pytest.approx(1.0)


def test_composer_records_each_component_unweighted_and_the_weighted_total():
    """Guards against reward terms that are summed but not visible (invariant 5): each component is kept
    unweighted per episode beside the weighted total."""
    trajs = [make_traj(correct=True), make_traj(correct=False, info={"format_ok": False})]
    composer = RewardComposer([RewardSpec("accuracy", weight=2.0), RewardSpec("format", weight=0.5)])
    assert composer(trajs) == [pytest.approx(2.5), pytest.approx(0.0)]
    assert trajs[0].reward_components == {"accuracy": 1.0, "format": 1.0}
    assert trajs[1].reward == 0.0


def test_an_envs_reported_reward_parts_are_logged_at_weight_zero_and_never_paid_twice():
    """Guards against an env's named reward parts (a verifiers rubric's functions) that are invisible,
    added to the total a second time beside env_steps, or missing from another env's episodes in a mix
    (every episode of a batch must log the same columns)."""
    from agentic_rl.rewards.base import reported_terms

    rubric = make_traj(turn_rewards=[0.0, 1.5], info={"reward_terms": {"rubric.correct": 1.0, "rubric.short": 1.0}})
    other = make_traj(turn_rewards=[1.0])
    composer = RewardComposer([RewardSpec("env_steps")], reported_terms(["rubric.correct", "rubric.short"]))
    assert composer([rubric, other]) == [1.5, 1.0]
    assert rubric.reward_components == {"env_steps": 1.5, "rubric.correct": 1.0, "rubric.short": 1.0}
    assert other.reward_components == {"env_steps": 1.0, "rubric.correct": 0.0, "rubric.short": 0.0}
    with pytest.raises(ValueError, match=r"reward term\(s\) \['env_steps'\] are both in the reward list and reported"):
        RewardComposer([RewardSpec("env_steps")], reported_terms(["env_steps"]))


def test_unknown_reward_and_parameter_are_rejected_with_the_options():
    """Guards against a typo'd reward or parameter being ignored (invariant 6): the error lists the rewards or
    parameters that exist."""
    with pytest.raises(ValueError, match="unknown reward 'acuracy'; registered rewards: .*accuracy"):
        RewardSpec("acuracy").check()
    with pytest.raises(ValueError, match=r"no parameter\(s\) \['gama'\]; allowed: \['gamma'\]"):
        RewardSpec("env_steps", params={"gama": 0.9}).check()


@pytest.mark.parametrize(
    "params, message",
    [
        ({"alpha": "lots"}, "params.alpha must be a number, got 'lots'"),
        ({"target": 2.5}, "params.target must be a whole number, got 2.5"),
        ({"target": True}, "params.target must be a whole number, got True"),
    ],
)
def test_reward_params_of_the_wrong_type_stop_the_config_before_anything_loads(params, message):
    """Guards against `length_penalty` with `alpha: lots` passing validation and dying after the model
    loaded and the first rollout (`TypeError: bad operand type for unary -: 'str'`, 20 frames): each
    parameter is checked against the term's annotation when the config is read."""
    from agentic_rl.config import ConfigError
    from agentic_rl.training.grpo_config import GRPOConfig
    from agentic_rl.validation import load_and_validate

    with pytest.raises(ConfigError, match=re.escape(f"reward 'length_penalty': {message}")):
        load_and_validate(
            GRPOConfig,
            None,
            overrides=["model.name=tiny-qwen3", f"rewards=[{{name: length_penalty, params: {json.dumps(params)}}}]"],
        )


def test_reward_params_of_the_annotated_types_pass_and_an_int_is_a_float():
    """Guards against the type check refusing good params: an int where a float is annotated is fine."""
    for spec in (
        RewardSpec("length_penalty", params={"alpha": 1, "target": 100}),
        RewardSpec("step_bonus", params={"beta": 0.1, "cap": 3}),
    ):
        spec.check()
    assert spec.params == {"beta": 0.1, "cap": 3}
