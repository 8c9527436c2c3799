"""Demonstration files (`sft.sources[].kind: jsonl`): every line checked, every error naming the file,
the line, the message and the fix (rollout/demo_schema.py, rollout/demos.py `load_jsonl_demos`)."""

from __future__ import annotations

import json
import re

import pytest

from agentic_rl.models.chat_format import ChatFormat
from agentic_rl.rollout.demos import DemoError, load_jsonl_demos
from agentic_rl.tools.parse import format_tool_call

CALL = format_tool_call("calculator", {"expression": "48/2"})
GOOD = {
    "messages": [
        {"role": "user", "content": "What is 48/2 + 3?"},
        {"role": "assistant", "content": "Step 1: halve 48.\n" + CALL},
        {"role": "tool", "name": "calculator", "content": "24"},
        {"role": "assistant", "content": "Step 2: 24 + 3 = 27\nFinal Answer: 27"},
    ],
    "tools": ["calculator"],
}


def _messages(*replace):
    """GOOD's messages with (index, message) replacements."""
    messages = [dict(m) for m in GOOD["messages"]]
    for index, message in replace:
        messages[index] = message
    return messages


def _refused(tmp_path, chat_format, bad_line, match, **kwargs):
    """Write GOOD, then `bad_line` (line 2); loading must fail naming file:2 and matching `match`."""
    path = tmp_path / "demos.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps(bad_line) + "\n")
    with pytest.raises(DemoError) as caught:
        load_jsonl_demos(path, chat_format, **kwargs)
    message = str(caught.value)
    assert message.startswith(f"{path}:2: "), message
    assert re.search(match, message), message
    return message


@pytest.fixture(scope="module")
def chat_format(qwen3_tokenizer):
    return ChatFormat(qwen3_tokenizer)


def test_a_good_file_loads_and_tool_calls_may_stand_for_the_content(tmp_path, chat_format):
    """Guards against checks so strict that the documented forms fail: tool_calls without content is
    the same demonstration as the call written in the content."""
    written = {"messages": _messages((1, {"role": "assistant", "content": CALL})), "tools": ["calculator"]}
    as_calls = {
        "messages": _messages(
            (1, {"role": "assistant", "tool_calls": [{"name": "calculator", "arguments": {"expression": "48/2"}}]})
        ),
        "tools": ["calculator"],
    }
    path = tmp_path / "demos.jsonl"
    path.write_text(json.dumps(written) + "\n" + json.dumps(as_calls) + "\n")
    first, second = load_jsonl_demos(path, chat_format)
    assert first.input_ids == second.input_ids and first.loss_mask == second.loss_mask


def test_an_unknown_role_is_refused(tmp_path, chat_format):
    """Guards against a message of an unknown role reaching the template."""
    message = _refused(
        tmp_path,
        chat_format,
        {"messages": _messages((0, {"role": "human", "content": "hi"}))},
        r"messages\[0\] needs a role of system, user, assistant, tool, got 'human'",
    )
    assert "human" in message


def test_a_message_without_content_is_refused(tmp_path, chat_format):
    """Guards against a user message with no content rendered as an empty turn (accepted before)."""
    _refused(
        tmp_path,
        chat_format,
        {"messages": _messages((0, {"role": "user"}))},
        r'messages\[0\]: a user message needs "content", a string',
    )


def test_a_non_string_content_is_refused(tmp_path, chat_format):
    """Guards against a raw traceback (or a list rendered as its repr) for content that is not text."""
    _refused(
        tmp_path,
        chat_format,
        {"messages": _messages((0, {"role": "user", "content": ["What is", 48]}))},
        r'messages\[0\]: "content" must be a string, got list \["What is", 48\]; write the text as one JSON string',
    )


def test_a_tool_message_with_no_preceding_call_is_refused(tmp_path, chat_format):
    """Guards against SFT training on a tool result the model never asked for (accepted before)."""
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "tool", "name": "calculator", "content": "24"},
        {"role": "assistant", "content": "Final Answer: 24"},
    ]
    _refused(
        tmp_path,
        chat_format,
        {"messages": messages},
        r"messages\[1\] is a tool result that answers no call.*make this a \"user\" message",
    )


def test_more_tool_results_than_calls_is_refused(tmp_path, chat_format):
    """Guards against a second result for a turn that made one call."""
    messages = [*GOOD["messages"][:3], {"role": "tool", "name": "calculator", "content": "25"}, GOOD["messages"][3]]
    _refused(
        tmp_path,
        chat_format,
        {"messages": messages, "tools": ["calculator"]},
        r"messages\[3\] is a tool result that answers no call",
    )


def test_a_tool_result_named_for_another_tool_is_refused(tmp_path, chat_format):
    """Guards against results attributed to the wrong call."""
    _refused(
        tmp_path,
        chat_format,
        {"messages": _messages((2, {"role": "tool", "name": "python", "content": "24"}))},
        r"messages\[2\] has name 'python', but the call it answers is to 'calculator'",
    )


def test_an_unknown_message_key_is_refused(tmp_path, chat_format):
    """Guards against keys silently dropped (a misspelt "content" or an OpenAI-only field)."""
    _refused(
        tmp_path,
        chat_format,
        {"messages": _messages((0, {"role": "user", "content": "hi", "weight": 2}))},
        r"messages\[0\]: unknown key 'weight' in a user message; it may only hold role, content",
    )


def test_an_unknown_line_key_is_refused(tmp_path, chat_format):
    """Guards against a line-level setting that is silently ignored (e.g. "tool" for "tools")."""
    _refused(
        tmp_path,
        chat_format,
        {"messages": GOOD["messages"], "tool": ["calculator"]},
        r"unknown key 'tool' in the line; a line may only hold messages, tools",
    )


def test_tool_call_arguments_that_are_not_an_object_are_refused(tmp_path, chat_format):
    """Guards against a call rendered with arguments the tool parser will never accept."""
    bad = {"role": "assistant", "tool_calls": [{"name": "calculator", "arguments": "48/2"}]}
    _refused(
        tmp_path,
        chat_format,
        {"messages": _messages((1, bad)), "tools": ["calculator"]},
        r"messages\[1\]: tool_calls\[0\] .*the arguments must be a JSON object, got \"48/2\"",
    )


def test_a_demonstration_longer_than_the_configured_limit_is_refused(tmp_path, chat_format):
    """Guards against training on (or cutting) a demonstration longer than sft.sources[].max_tokens."""
    _refused(
        tmp_path,
        chat_format,
        {"messages": _messages((0, {"role": "user", "content": "word " * 300})), "tools": ["calculator"]},
        r"the demonstration is 627 tokens, longer than 400 \(sft\.sources\[0\]\.max_tokens\); shorten or split",
        max_tokens=400,
        limit_name="sft.sources[0].max_tokens",
    )  # the good line 1 is 337 tokens


def test_a_demonstration_longer_than_the_models_context_is_refused(tmp_path):
    """Guards against a 10 MB line of 1.25 M tokens accepted against a 131 k context: build_demos takes
    the limit from the loaded model (through its LoRA wrapper), whose context here is 4,096 tokens."""
    from agentic_rl.models.policy import ModelConfig, context_length, load_policy
    from agentic_rl.training.sft import DemoSource, build_demos

    policy, tokenizer, _ = load_policy(ModelConfig(name="tiny-qwen3"), log=lambda *a: None)
    assert context_length(policy) == 4096
    path = tmp_path / "demos.jsonl"
    long = {"messages": _messages((0, {"role": "user", "content": "word " * 5000})), "tools": ["calculator"]}
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps(long) + "\n")
    with pytest.raises(
        DemoError,
        match=rf"^{re.escape(str(path))}:2: the demonstration is 5327 tokens, longer than 4096 "
        r"\(the model's context, max_position_embeddings=4096\)",
    ):
        build_demos([DemoSource(kind="jsonl", path=str(path))], tokenizer, 0, context=context_length(policy))
    assert (
        len(build_demos([DemoSource(kind="jsonl", path=str(path), max_tokens=None)], tokenizer, 0, context=None)) == 2
    )


def test_a_message_with_a_repeated_key_is_refused_naming_the_key(tmp_path, chat_format):
    """Guards against a demonstration message with "role" twice keeping the last one silently."""
    path = tmp_path / "demos.jsonl"
    line = json.dumps(GOOD).replace('{"role": "user", ', '{"role": "assistant", "role": "user", ', 1)
    path.write_text(json.dumps(GOOD) + "\n" + line + "\n")
    with pytest.raises(
        DemoError, match=rf"^{re.escape(str(path))}:2: not valid JSON \(the key 'role' appears twice in one object"
    ):
        load_jsonl_demos(path, chat_format)


def test_text_that_is_not_unicode_is_refused_naming_the_line_and_field(tmp_path, chat_format):
    """Guards against a lone surrogate in a demonstration ending in the tokenizer's raw TypeError."""
    message = _refused(
        tmp_path,
        chat_format,
        {"messages": _messages((0, {"role": "user", "content": "a\ud800b"}))},
        r"messages\[0\]\.content holds a lone surrogate",
    )
    assert "fix the text there" in message


def test_a_line_of_too_many_messages_is_refused_before_anything_is_rendered(tmp_path, chat_format, monkeypatch):
    """Guards against one line of 200k short messages running for > 300 s before any check (here 2,000): rendering
    costs the square of a line's message count, so the count is checked first (MAX_MESSAGES)."""
    from agentic_rl.rollout.demo_schema import MAX_MESSAGES

    render = ChatFormat.render

    def checked_first(self, messages, *args, **kwargs):
        assert len(messages) <= MAX_MESSAGES, "rendered before the count was checked"
        return render(self, messages, *args, **kwargs)

    monkeypatch.setattr(ChatFormat, "render", checked_first)
    turns = [{"role": role, "content": "a"} for _ in range(1000) for role in ("user", "assistant")]
    _refused(
        tmp_path,
        chat_format,
        {"messages": turns},
        rf"2000 messages in one demonstration, more than {MAX_MESSAGES}; split",
    )


def test_a_line_longer_than_the_line_limit_is_refused_before_it_is_parsed(tmp_path, chat_format, monkeypatch):
    """Guards against a line of gigabytes read, parsed and kept in memory whole: past MAX_LINE_BYTES
    (more text than any model's context) it is refused having read no more than that."""
    monkeypatch.setattr("agentic_rl.rollout.demo_schema.MAX_LINE_BYTES", 1000)
    monkeypatch.setattr("agentic_rl.rollout.demos.MAX_LINE_BYTES", 1000)
    long = {"messages": _messages((0, {"role": "user", "content": "x" * 1000}))}
    _refused(tmp_path, chat_format, long, r"the line is longer than 1000 bytes, the most one line may hold; split it")
    pad = 1000 - len(json.dumps({**GOOD, "messages": _messages((0, {"role": "user", "content": ""}))}))
    exact = json.dumps({**GOOD, "messages": _messages((0, {"role": "user", "content": "x" * pad}))}).encode()
    assert len(exact) == 1000
    path = tmp_path / "fits.jsonl"
    path.write_bytes(exact + b"\r\n" + exact + b"\r\n")  # at the limit, with Windows line ends: both load
    assert len(load_jsonl_demos(path, chat_format)) == 2


def test_sft_checks_a_demonstration_file_before_the_model_loads(tmp_path, monkeypatch):
    """Guards against a bad JSONL file being found only after the model loaded (minutes for a real one):
    `agentic-rl sft` reads and checks every line first, naming the file and line."""
    from agentic_rl.config import load_config
    from agentic_rl.training.sft import SFTConfig, train_sft

    path = tmp_path / "demos.jsonl"
    path.write_text(
        json.dumps(GOOD) + "\n" + json.dumps({"messages": _messages((0, {"role": "narrator", "content": "x"}))}) + "\n"
    )
    monkeypatch.setattr("agentic_rl.training.sft.load_policy", lambda *a, **k: pytest.fail("the model loaded first"))
    cfg = load_config(
        SFTConfig,
        None,
        overrides=[
            "model.name=tiny-qwen3",
            f"sources=[{{kind: jsonl, path: {path}}}]",
            f"train.output_dir={tmp_path / 'run'}",
            "batch_size=1",
            "micro_batch_size=1",
        ],
    )
    with pytest.raises(DemoError, match=rf"^{re.escape(str(path))}:2: messages\[0\] needs a role"):
        train_sft(cfg)
