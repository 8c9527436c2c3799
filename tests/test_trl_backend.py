"""`backend: trl`: our envs and reward terms inside TRL 1.16's GRPOTrainer.

* The reward adapter returns exactly our reward terms' values (single-turn grading from the `task`
  column; multi-turn grading through the TRL environment instance that ran the tools).
* The environment class TRL gets exposes exactly our env's tools, with our tool schema.
* The multi-turn tool path runs end to end for 2 steps on tiny-qwen3 (Qwen3's template). A random
  2-layer model never writes a tool call, so its decoder is replaced by a scripted one that answers with
  our env's oracle turns (tool calls, then the final answer): TRL's real tool loop parses them, runs our
  env's calculator through the adapter, appends the results and regenerates; our rewards score it.
* Settings TRL cannot honour raise TRLConfigError.
"""

from __future__ import annotations

import pytest

trl = pytest.importorskip("trl")

from agentic_rl.envs.arith import oracle_actions  # noqa: E402
from agentic_rl.envs.base import make_env  # noqa: E402
from agentic_rl.integrations.trl_adapters import (  # noqa: E402
    make_trl_environment_factory,
    make_trl_reward_funcs,
    task_to_json,
)
from agentic_rl.rewards.base import RewardSpec  # noqa: E402
from agentic_rl.training.episode_config import EnvMixPart  # noqa: E402

OPTIONS = {"difficulty": 1}
SPECS = [
    RewardSpec("accuracy"),
    RewardSpec("format", weight=0.5),
    RewardSpec("tool_use"),
    RewardSpec("step_bonus", params={"beta": 0.1, "cap": 5}),
]


def _task():
    return make_env("arith", **OPTIONS).tasks("train", n=1, seed=0)[0]


def test_reward_adapter_single_turn_returns_our_values():
    """Guards against TRL's reward functions disagreeing with ours: the adapter returns our values and weights,
    and the step bonus pays only on a correct answer."""
    task = _task()
    funcs, weights = make_trl_reward_funcs(SPECS, "arith", OPTIONS)
    assert [f.__name__ for f in funcs] == ["accuracy", "format", "tool_use", "step_bonus"]
    assert weights == [1.0, 0.5, 1.0, 1.0]
    completions = [
        [{"role": "assistant", "content": f"Step 1: done.\nStep 2: so.\nFinal Answer: {task.answer}"}],
        [{"role": "assistant", "content": f"Final Answer: {int(task.answer) + 1}"}],
        [{"role": "assistant", "content": "I do not know."}],
    ]
    kwargs = {"task": [task_to_json(task)] * 3, "completion_ids": [[1, 2, 3]] * 3, "trainer_state": None}
    values = {f.__name__: f(prompts=[[]] * 3, completions=completions, **kwargs) for f in funcs}
    assert values["accuracy"] == [1.0, 0.0, 0.0]
    assert values["format"] == [1.0, 1.0, 0.0]
    assert values["tool_use"] == [0.0, 0.0, 0.0]
    assert values["step_bonus"] == pytest.approx([0.2, 0.0, 0.0])  # paid only on the correct answer


def test_environment_factory_runs_our_tools_and_grades():
    """Guards against TRL running other tools than our env's: the factory exposes exactly our calculator with
    our schema, our error text, and grades once."""
    task = _task()
    factory = make_trl_environment_factory("arith", OPTIONS)
    public = sorted(n for n in vars(factory) if not n.startswith("_"))
    assert public == ["calculator"]  # exactly our env's tools become TRL tools
    from transformers.utils import get_json_schema

    schema = get_json_schema(factory().calculator)
    ours = make_env("arith", **OPTIONS).tool_schemas[0]
    assert schema["function"]["parameters"] == ours["function"]["parameters"]
    assert schema["function"]["name"] == "calculator"

    envs = [factory(), factory()]
    for env in envs:
        assert env.reset(prompt=[], task=task_to_json(task)) is None
    expression, value = task.meta["steps"][0]
    assert envs[0].calculator(expression=expression) == value
    assert envs[1].calculator(expression="2 +").startswith("Error:")  # our env's error observation
    completions = [
        [
            {"role": "assistant", "content": "", "tool_calls": [{}]},
            {"role": "tool", "content": value},
            {"role": "assistant", "content": f"Step 2: ok.\nFinal Answer: {task.answer}"},
        ],
        [
            {"role": "assistant", "content": "", "tool_calls": [{}]},
            {"role": "tool", "content": "Error"},
            {"role": "assistant", "content": "Final Answer: 0"},
        ],
    ]
    funcs, _ = make_trl_reward_funcs(SPECS)
    values = {
        f.__name__: f(prompts=[[], []], completions=completions, completion_ids=[[1] * 5, [1] * 5], environments=envs)
        for f in funcs
    }
    assert values["accuracy"] == [1.0, 0.0]
    assert values["tool_use"] == [1.0, 0.0]
    assert values["step_bonus"] == pytest.approx([0.1, 0.0])
    assert envs[0]._finalize(completions[0])["tool_calls"] == 1  # graded once, cached


def _cfg(tmp_path, **overrides):
    from agentic_rl.models.policy import ModelConfig
    from agentic_rl.training.episode_config import EnvConfig
    from agentic_rl.training.grpo_config import GRPOConfig, GRPORolloutConfig
    from agentic_rl.training.loop import LoopConfig

    base = dict(
        backend="trl",
        model=ModelConfig(name="tiny-qwen3"),
        env=EnvConfig(name="arith", options=OPTIONS, task_pool=4),
        rewards=SPECS,
        rollout=GRPORolloutConfig(batch_size=2, group_size=2, max_turn_tokens=48, max_turns=3),
        micro_batch_size=2,
        train=LoopConfig(steps=2, output_dir=str(tmp_path / "run"), progress=False),
    )
    base.update(overrides)
    return GRPOConfig(**base)


@pytest.mark.e2e
def test_trl_backend_multi_turn_tools_end_to_end(tmp_path):
    """Guards against TRL's multi-turn loop not running our tools or grading before the tool result: a scripted
    oracle gets full reward in every row."""
    from agentic_rl.integrations.trl_backend import build_trl_trainer
    from agentic_rl.integrations.trl_adapters import task_from_json

    from agentic_rl.algorithms.grpo import GRPOLossConfig

    # beta = 0: no reference pass (keeps the test fast; the beta > 0 path is exercised by the benchmark)
    trainer, info = build_trl_trainer(_cfg(tmp_path, loss=GRPOLossConfig(beta=0.0)))
    assert info["multi_turn"] and info["max_turns"] == 3  # min(rollout.max_turns=3, env max_turns=8)
    tokenizer = trainer.processing_class
    tasks = [task_from_json(t) for t in trainer.train_dataset["task"]]
    calls = []

    def scripted(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        out = []
        for ids in prompt_ids:
            text = tokenizer.decode(ids)
            task = next(t for t in tasks if t.question in text)
            turn = text.count("<tool_response>")
            action = oracle_actions(task)[min(turn, len(oracle_actions(task)) - 1)]
            calls.append(turn)
            out.append(
                tokenizer.encode(action + "<|im_end|>", add_special_tokens=False)
            )  # prompts arrive repeated G times
        return out, None

    trainer._generate_single_turn = scripted
    trainer.train()
    rows = [r for r in trainer.state.log_history if "rewards/accuracy/mean" in r]
    assert len(rows) == 2
    for row in rows:
        assert row["tools/call_frequency"] == 1.0  # one calculator call per episode, run by our env
        assert row["rewards/tool_use/mean"] == 1.0
        assert row["rewards/accuracy/mean"] == 1.0  # graded by our env after the tool result came back
        assert row["rewards/format/mean"] == 1.0
    assert 1 in calls  # a second generation happened after a tool response


@pytest.mark.parametrize(
    "override, message",
    [
        (lambda c: {"advantage": type(c.advantage)(mode="turn")}, "advantage.mode=turn"),
        (lambda c: {"rollout": type(c.rollout)(batch_size=2, group_size=2, backend="fast")}, "backend=fast"),
        (lambda c: {"rollout": type(c.rollout)(batch_size=2, group_size=2, tool_workers=8)}, "tool_workers"),
        (lambda c: {"updates_per_batch": 2}, "old_logprobs=sampling"),
        (lambda c: {"micro_batch_size": 3}, "micro_batch_size=3"),
        (
            lambda c: {
                "env": type(c.env)(
                    name="arith",
                    options={"difficulty": 1},
                    task_pool=4,
                    mix=[EnvMixPart(), EnvMixPart({"difficulty": 2})],
                )
            },
            "env.mix",
        ),
    ],
)
def test_unmappable_settings_raise(tmp_path, override, message):
    """Guards against settings TRL's GRPOTrainer cannot honour being dropped silently on the TRL backend
    (invariant 6)."""
    from agentic_rl.integrations.trl_backend import TRLConfigError, build_trl_trainer

    cfg = _cfg(tmp_path)
    cfg = _cfg(tmp_path, **override(cfg))
    with pytest.raises(TRLConfigError, match=message.replace(".", r"\.")):
        build_trl_trainer(cfg)


def test_reward_model_term_raises(tmp_path):
    """Guards against a reward-model term silently dropped on the TRL backend, which cannot score with our
    reward model."""
    import dataclasses

    from agentic_rl.integrations.trl_backend import TRLConfigError, _check_unmappable

    cfg = _cfg(tmp_path)
    cfg = dataclasses.replace(cfg, reward_model=dataclasses.replace(cfg.reward_model, path="some/rm", weight=1.0))
    with pytest.raises(TRLConfigError, match="reward_model"):
        _check_unmappable(cfg)
