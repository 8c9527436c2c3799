"""`agentic-rl chat`: each reply is an engine episode whose prompt is the conversation so far, and
every turn's words, tool calls and tool results reach the screen as they happen."""

import subprocess
import sys

from agentic_rl.envs.base import Task
from agentic_rl.rollout.config import RolloutConfig, Sampling
from agentic_rl.serving.chat import ConversationEnv, chat_loop
from agentic_rl.tools.parse import format_tool_call


def test_a_turn_with_a_call_shows_the_words_the_call_and_its_result_then_the_reply_ends():
    """Guards against a chat that hides tool calls or stops at a malformed one: history is kept, each call and
    result is shown, and the reply ends at the answer."""
    events = []
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello."}]
    env = ConversationEnv(["calculator"], history, max_turns=4, on_event=events.append)
    messages = env.reset(Task("chat/2", "What is 48/2 + 3?", ""))
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"] and messages[1:3] == history
    first = env.step("Step 1: halve 48.\n" + format_tool_call("calculator", {"expression": "48/2"}))
    assert not first.done and first.observation[0]["content"] == "24"
    second = env.step("<tool_call>{not json</tool_call>")
    final = env.step("Step 2: 24 + 3 = 27\nFinal Answer: 27")
    assert not second.done and final.done
    assert events[:3] == [
        ("assistant", "Step 1: halve 48."),
        ("call", 'calculator {"expression": "48/2"}'),
        ("result", "24"),
    ]
    assert events[3][0] == "call" and events[3][1].startswith("(malformed") and events[4][0] == "result"
    assert events[5] == ("assistant", "Step 2: 24 + 3 = 27\nFinal Answer: 27")


def test_the_conversation_carries_over_from_one_reply_to_the_next(tiny_qwen3):
    """Guards against a chat loop that forgets earlier turns or keeps empty input: the second question sees the
    first exchange, and every reply shows something."""
    model, tokenizer = tiny_qwen3
    inputs = iter(["first question", "", "second question", None])
    shown = []
    history = chat_loop(
        model,
        tokenizer,
        ["calculator"],
        RolloutConfig(max_turn_tokens=6, max_turns=1, sampling=Sampling(temperature=0.0)),
        read=lambda: next(inputs),
        show=shown.append,
    )
    users = [m["content"] for m in history if m["role"] == "user"]
    assert users == ["first question", "second question"]  # the empty line is skipped
    assert [m["role"] for m in history][:2] == ["user", "assistant"] and history[-1]["role"] == "assistant"
    assert shown, "every reply shows something (its words or why it stopped)"


def test_the_cli_reads_stdin_until_exit():
    """Guards against `agentic-rl chat` reading past `exit` or failing without a terminal: it prompts twice on
    piped stdin and exits 0."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentic_rl.cli",
            "chat",
            "--model",
            "tiny-qwen3",
            "--max-turn-tokens",
            "4",
            "--max-turns",
            "1",
        ],
        input="hello\nexit\nnever read\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("you> ") == 2 and "tools: calculator" in done.stdout
