"""ChatFormat: prompts and observation deltas consistent with each tokenizer's chat template (invariant 1).

Both real tokenizers: Qwen3's (tools-aware template, via tiny-qwen3) and SmolLM2's (plain ChatML,
tools injected Hermes-style). Engine-level re-render checks live in test_rollout_engine.py.
"""

from __future__ import annotations

import contextlib

import pytest

from agentic_rl.models.chat_format import ChatFormat, ChatFormatError
from agentic_rl.tools.parse import format_tool_call

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
START = [{"role": "system", "content": "You solve problems."}, {"role": "user", "content": "What is 48/2+1?"}]


CALL = format_tool_call("calculator", {"expression": "48/2"})


@pytest.fixture(scope="module", params=["tiny-qwen3", "smollm2-135m-instruct"])
def chat(request, shared_tokenizer):
    tokenizer = shared_tokenizer(request.param)
    return request.param, tokenizer, ChatFormat.for_tokenizer(tokenizer)


def test_prompt_ids_equal_the_template_with_generation_prompt(chat):
    """Guards against prompts that add a BOS or miss the assistant header the model continues from."""
    name, tokenizer, chat_format = chat
    ids = chat_format.prompt_ids(START, TOOLS)
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n")
    if name == "tiny-qwen3":
        expected = tokenizer.apply_chat_template(
            START, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
        assert ids == list(expected)
    assert "<tools>" in tokenizer.decode(ids) and '"name": "calculator"' in tokenizer.decode(ids)


def test_observation_after_a_tool_call_starts_with_the_end_of_turn_marker(chat):
    """Guards against losing <|im_end|> when a turn stops at </tool_call>: it must be in the observation (mask 0)."""
    _, tokenizer, chat_format = chat
    observation = [{"role": "tool", "name": "calculator", "content": "24"}]
    ids = chat_format.observation_ids(START, CALL, observation, TOOLS)
    assert (
        tokenizer.decode(ids)
        == "<|im_end|>\n<|im_start|>user\n<tool_response>\n24\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert ids[0] == chat_format.end_of_turn_id


def test_observation_after_a_generated_end_of_turn_starts_after_it(chat):
    """Guards against a duplicated <|im_end|> when the policy generated it itself (mask 1)."""
    _, tokenizer, chat_format = chat
    ids = chat_format.observation_ids(
        START, "24+1 = 25<|im_end|>", [{"role": "user", "content": "Show the steps."}], TOOLS
    )
    assert tokenizer.decode(ids) == "\n<|im_start|>user\nShow the steps.<|im_end|>\n<|im_start|>assistant\n"


def test_incremental_tokens_equal_the_full_render_tokens(chat):
    """Guards against tokenizer merges across the observation boundary (delta tokenized alone vs. in context)."""
    _, tokenizer, chat_format = chat
    observation = [
        {"role": "tool", "name": "calculator", "content": "24"},
        {"role": "tool", "name": "calculator", "content": "25"},
    ]
    incremental = (
        chat_format.prompt_ids(START, TOOLS)
        + chat_format.encode(CALL)
        + chat_format.observation_ids(START, CALL, observation, TOOLS)
    )
    full = chat_format.encode(
        chat_format.render(
            [*START, {"role": "assistant", "content": CALL}, *observation], TOOLS, add_generation_prompt=True
        )
    )
    assert incremental == full


def test_chatml_template_without_tools_gets_hermes_tools_and_tool_responses_as_one_user_turn(shared_tokenizer):
    """Documents SmolLM2's rendering: tools in the system message, tool results as a user <tool_response> turn."""
    tokenizer = shared_tokenizer("smollm2-135m-instruct")
    chat_format = ChatFormat.for_tokenizer(tokenizer)
    assert not chat_format.supports_tools
    text = chat_format.render(
        [
            *START,
            {"role": "assistant", "content": CALL},
            {"role": "tool", "content": "24"},
            {"role": "tool", "content": "1"},
        ],
        TOOLS,
    )
    assert text.startswith("<|im_start|>system\nYou solve problems.\n\n# Tools\n")
    assert (
        "<|im_start|>user\n<tool_response>\n24\n</tool_response>\n<tool_response>\n1\n</tool_response><|im_end|>"
        in text
    )
    qwen = ChatFormat.for_tokenizer(shared_tokenizer("tiny-qwen3"))
    assert qwen.supports_tools
    # Same text as Qwen3's own template renders, so one SFT format serves both families.
    same = [*START, {"role": "assistant", "content": CALL}, {"role": "tool", "content": "24"}]
    assert chat_format.render(same, TOOLS) == qwen.render(same, TOOLS)


def test_system_message_is_created_for_tools_when_missing(shared_tokenizer):
    """Guards against SmolLM2's default system prompt silently replacing the tool instructions."""
    chat_format = ChatFormat.for_tokenizer(shared_tokenizer("smollm2-135m-instruct"))
    text = chat_format.render([{"role": "user", "content": "hi"}], TOOLS, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n# Tools") and "SmolLM" not in text


def test_turn_ends_at_tool_call_close_whether_one_token_or_several(chat):
    """Guards against stop detection that only works when </tool_call> is a single special token (Qwen3)."""
    name, tokenizer, chat_format = chat
    ids = chat_format.encode("Let me compute.\n" + CALL)
    assert (len(chat_format.encode("</tool_call>")) == 1) == (name == "tiny-qwen3")
    first_stop = next(i for i in range(1, len(ids) + 1) if chat_format.ends_turn(ids[:i]))
    assert first_stop == len(ids)
    assert chat_format.ends_turn(chat_format.encode("done<|im_end|>"))
    assert not chat_format.ends_turn(chat_format.encode("<tool_call>\n{}"))


def test_template_that_rewrites_the_prefix_is_rejected(shared_tokenizer):
    """Guards against silently wrong observation tokens for a template that is not incremental."""
    tokenizer = shared_tokenizer("smollm2-135m-instruct")
    chat_format = ChatFormat.for_tokenizer(tokenizer)
    # A template that prints the number of messages first: every appended message changes the prefix.
    counting = (
        "{{ messages|length }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with _with_template(tokenizer, counting), pytest.raises(ChatFormatError, match="prefix"):
        chat_format.observation_ids(START, CALL, [{"role": "tool", "content": "24"}])


def test_tokenizer_without_a_template_is_rejected(shared_tokenizer):
    """Guards against falling back to some default format the model was never trained on."""
    tokenizer = shared_tokenizer("smollm2-135m-instruct")
    with _with_template(tokenizer, None), pytest.raises(ChatFormatError, match="no chat template"):
        ChatFormat.for_tokenizer(tokenizer)


@contextlib.contextmanager
def _with_template(tokenizer, template):
    """Swap the (cached, shared) tokenizer's template for the duration of a test."""
    saved = tokenizer.chat_template
    tokenizer.chat_template = template
    try:
        yield tokenizer
    finally:
        tokenizer.chat_template = saved
