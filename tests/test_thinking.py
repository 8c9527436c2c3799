"""`enable_thinking` (rollout.enable_thinking, sft.enable_thinking): the chat template's thinking
switch reaches every rendering, on the vendored Qwen3 tokenizer.

Qwen3's template, add_generation_prompt=True:
    null / true    ...<|im_start|>assistant\\n                      (the model opens <think> itself)
    false          ...<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n
"""

from __future__ import annotations

import pytest

from agentic_rl.models.chat_format import ChatFormat, ChatFormatError

MESSAGES = [
    {"role": "system", "content": "Solve it. End with Final Answer: <number>."},
    {"role": "user", "content": "What is 48/2 + 3?"},
]
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "48/2"}}\n</tool_call>'
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate arithmetic.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]
EMPTY_THINK = "<think>\n\n</think>\n\n"


def _template(tokenizer, messages, setting, **kwargs) -> str:
    options = {} if setting is None else {"enable_thinking": setting}
    return tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False, **kwargs, **options)


@pytest.mark.parametrize("setting", [None, True, False])
def test_the_prompt_is_the_templates_rendering_with_the_setting(qwen3_tokenizer, setting):
    """Guards against a switch that never reaches the template (the seed's model then always thinks)."""
    chat = ChatFormat(qwen3_tokenizer, enable_thinking=setting)
    text = _template(qwen3_tokenizer, MESSAGES, setting, add_generation_prompt=True)
    assert chat.prompt_ids(MESSAGES, TOOLS) == qwen3_tokenizer.encode(text, add_special_tokens=False)
    assert text.endswith("<|im_start|>assistant\n" + (EMPTY_THINK if setting is False else ""))


@pytest.mark.parametrize("setting", [None, True, False])
def test_earlier_turns_stay_a_token_prefix_and_match_the_template(qwen3_tokenizer, setting):
    """Guards against non-thinking multi-turn episodes: the template drops the empty think block
    of an earlier turn when it re-renders, so a re-render-based observation would rewrite what
    the policy saw (or the prefix check would refuse every observation)."""
    chat = ChatFormat(qwen3_tokenizer, enable_thinking=setting)
    prompt = chat.prompt_ids(MESSAGES, TOOLS)
    turn = chat.encode(CALL)
    observation = chat.observation_ids(MESSAGES, CALL, [{"role": "tool", "content": "24"}], TOOLS)
    episode = prompt + turn + observation
    assert episode[: len(prompt) + len(turn)] == prompt + turn  # the policy's context is kept, token for token
    rerendered = _template(
        qwen3_tokenizer,
        [*MESSAGES, {"role": "assistant", "content": CALL}, {"role": "tool", "content": "24"}],
        setting,
        add_generation_prompt=True,
    )
    header = len(
        _template(qwen3_tokenizer, MESSAGES, None, add_generation_prompt=True)
    )  # through turn 1's `assistant\n`
    # The episode is the template's rendering, plus (false) the empty think block the policy saw before its first turn.
    expected = rerendered[:header] + (EMPTY_THINK if setting is False else "") + rerendered[header:]
    assert episode == qwen3_tokenizer.encode(expected, add_special_tokens=False)
    assert qwen3_tokenizer.decode(observation).endswith(
        "<|im_start|>assistant\n" + (EMPTY_THINK if setting is False else "")
    )


def test_a_template_without_the_switch_refuses_a_set_value(shared_tokenizer):
    """Guards against a setting silently ignored (SmolLM2's ChatML has no enable_thinking)."""
    smollm2 = shared_tokenizer("smollm2-135m-instruct")
    ChatFormat(smollm2)  # unset: fine
    with pytest.raises(
        ChatFormatError, match="enable_thinking=false, but this tokenizer's chat template has no enable_thinking switch"
    ):
        ChatFormat(smollm2, enable_thinking=False)


def test_episodes_demonstrations_and_pairs_render_with_the_setting(tiny_qwen3):
    """Guards against a stage that renders in the template's default mode while another renders
    with the setting: the rollout engine (eval, grpo, ppo, serve, chat, audit), SFT's
    demonstrations and the RM's pairs."""
    from agentic_rl.rollout.config import RolloutConfig
    from agentic_rl.rollout.factory import build_engine
    from agentic_rl.training.reward_model import PairsConfig, build_pairs
    from agentic_rl.training.sft import DemoSource, build_demos

    from agentic_rl.envs.base import EnvSpec

    model, tokenizer = tiny_qwen3
    engine = build_engine(
        model, tokenizer, RolloutConfig(max_turn_tokens=4, max_turns=1, enable_thinking=False), seed=0
    )
    env = EnvSpec().make()
    [episode] = engine.run([env], env.tasks("test", n=1, seed=0))
    demo = build_demos([DemoSource(n=1)], tokenizer, seed=0, enable_thinking=False)[0]
    chosen, rejected = build_pairs(
        PairsConfig(tasks=2, rollout=RolloutConfig(enable_thinking=False)), "train", 2, tokenizer, seed=0
    )[0]
    for name, trajectory in (("episode", episode), ("demonstration", demo), ("chosen", chosen), ("rejected", rejected)):
        policy_start = trajectory.policy_spans[0].start
        before = tokenizer.decode(trajectory.input_ids[:policy_start])
        assert before.endswith("<|im_start|>assistant\n" + EMPTY_THINK), name


def test_a_pipeline_whose_stages_disagree_is_refused():
    """Guards against SFT teaching one mode and GRPO or the evaluations running another."""
    from agentic_rl.config import load_config
    from agentic_rl.pipeline import PipelineConfig

    agreed = load_config(
        PipelineConfig,
        overrides=[
            "sft.enable_thinking=false",
            "rm.pairs.rollout.enable_thinking=false",
            "grpo.rollout.enable_thinking=false",
            "evals=[{rollout: {enable_thinking: false}}]",
        ],
    )
    assert agreed.evals[0].rollout.enable_thinking is False and agreed.grpo.rollout.enable_thinking is False
    with pytest.raises(
        ValueError,
        match=r"enable_thinking differs between the stages of one model \(sft.enable_thinking=False, "
        r"rm.pairs.rollout.enable_thinking=None",
    ):
        load_config(PipelineConfig, overrides=["sft.enable_thinking=false"])
