"""Demonstrations as Trajectories, built exactly the way the rollout engine builds episodes.

What SFT teaches must be what RL samples, so a demonstration goes through the same ChatFormat:
the prompt and observations are rendered by the chat template (mask 0), and each assistant
turn is tokenized as policy tokens (mask 1): its think and tool-call markers are control tokens,
any other control string in it (`<|im_end|>` in a file's content, a call's arguments) plain text. A turn that calls a tool ends at `</tool_call>`
with no end-of-turn token, as the engine stops it; a final turn ends with the end-of-turn
token, which is trained (the model must learn to stop).

Three sources:
  * `oracle_demos(env, tasks, chat_format)`: the env's scripted oracle, run through the real env API
    by `envs.oracle.play_oracle`,
    so tool results are real (arith's solver; GSM8K's `<<expr=value>>` annotations). An env that
    changes the context (memory's window) gives demonstrations of several sequences, as the engine
    does (Trajectory.previous); `demo_sequences` lists them for SFT.
  * `load_jsonl_demos(path, chat_format)`: a user's file, one conversation per line:
        {"messages": [{"role": "system", "content": "..."},
                      {"role": "user", "content": "What is 48/2 + 3?"},
                      {"role": "assistant", "content": "Step 1: ...\\n<tool_call>\\n{\\"name\\": \\"calculator\\", \\"arguments\\": {\\"expression\\": \\"48/2\\"}}\\n</tool_call>"},
                      {"role": "tool", "name": "calculator", "content": "24"},
                      {"role": "assistant", "content": "Step 2: 24 + 3 = 27\\nFinal Answer: 27"}],
         "tools": ["calculator"]}
    "tools" names registered tools whose schemas the prompt shows (optional). An assistant
    message may instead carry "tool_calls": [{"name": ..., "arguments": {...}}], which is
    written in the canonical `<tool_call>` form.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Sequence

from agentic_rl.data import utf8_lines
from agentic_rl.envs.base import Env, Task
from agentic_rl.envs.oracle import play_oracle
from agentic_rl.models.chat_format import ChatFormat
from agentic_rl.rollout.demo_schema import MAX_LINE_BYTES, DemoError, check_demo_record
from agentic_rl.rollout.trajectory import Span, Trajectory
from agentic_rl.strict_json import NotUnicodeError, loads_data
from agentic_rl.tools.base import get_tool
from agentic_rl.tools.parse import TOOL_CALL_CLOSE, assistant_turn_text


def trajectory_from_messages(
    chat_format: ChatFormat,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None = None,
    env: str = "demo",
    task_id: str = "",
    info: dict[str, Any] | None = None,
    prompt_messages: int | None = None,
) -> Trajectory:
    """Token-exact trajectory of a finished conversation: prompt, then (assistant, observation)*.

    prompt_messages: how many leading messages form the prompt (mask 0); None: every message
    before the first assistant turn. A later sequence of a non-prefix episode passes the length of
    its context, whose assistant turns are then context, not policy turns."""
    first_assistant = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)
    if prompt_messages is not None:
        if not 0 < prompt_messages < len(messages) or messages[prompt_messages].get("role") != "assistant":
            raise DemoError(
                f"prompt_messages={prompt_messages} must leave the prompt non-empty and be followed by an assistant turn"
            )
        first_assistant = prompt_messages
    if first_assistant is None or first_assistant == 0:
        raise DemoError(
            "a demonstration needs at least one message before the first assistant turn, and one assistant turn"
        )
    if messages[-1].get("role") != "assistant":
        raise DemoError(f"a demonstration must end with an assistant turn, not '{messages[-1].get('role')}'")
    prompt = list(messages[:first_assistant])
    ids = chat_format.prompt_ids(prompt, tools)
    mask = [0] * len(ids)
    spans = [Span("prompt", 0, len(ids))]
    history = list(prompt)
    index = first_assistant
    while index < len(messages):
        text = assistant_turn_text(messages[index])
        observations = []
        index += 1
        while index < len(messages) and messages[index].get("role") != "assistant":
            observations.append(messages[index])
            index += 1
        calls_tool = text.rstrip().endswith(TOOL_CALL_CLOSE)
        turn_ids = chat_format.policy_ids(text) + ([] if calls_tool else [chat_format.end_of_turn_id])
        _append(ids, mask, spans, turn_ids, "policy")
        generated = text if calls_tool else text + chat_format.end_of_turn
        history.append({"role": "assistant", "content": text})
        if observations:
            obs_ids = chat_format.observation_ids(history[:-1], generated, observations, tools)
            _append(ids, mask, spans, obs_ids, "observation")
            history.extend(observations)
    trajectory = Trajectory(
        ids,
        mask,
        [0.0] * len(ids),
        spans,
        env=env,
        task_id=task_id,
        finish_reason="demo",
        messages=[dict(m) for m in history],
        info=dict(info or {}),
    )
    trajectory.check()
    return trajectory


def _append(ids: list[int], mask: list[int], spans: list[Span], new: list[int], kind: str) -> None:
    start = len(ids)
    ids.extend(new)
    mask.extend([1 if kind == "policy" else 0] * len(new))
    spans.append(Span(kind, start, len(ids)))  # type: ignore[arg-type]


def oracle_demos(env: Env, tasks: Sequence[Task], chat_format: ChatFormat) -> list[Trajectory]:
    """Run the env's oracle on each task through the env API; every demo must be graded correct."""
    demos = []
    for task in tasks:
        episode = play_oracle(env, task)
        result = episode.result
        if result is None or not result.done or not result.info.get("correct"):
            raise DemoError(
                f"the oracle of env '{env.name}' did not solve task {task.id}: {result.info if result else None}"
            )
        *earlier, last = [
            trajectory_from_messages(chat_format, messages, env.tool_schemas, env.name, task.id, prompt_messages=prompt)
            for messages, prompt in zip(episode.sequences, episode.sequence_prompts)
        ]
        last.info, last.messages, last.previous = dict(result.info), [dict(m) for m in episode.conversation], earlier
        last.turn_rewards = list(episode.rewards)  # every turn of the episode, as the engine records them
        demos.append(last)
    return demos


def demo_sequences(demos: Sequence[Trajectory]) -> list[Trajectory]:
    """Every token sequence of every demonstration, as its own training example (SFT's unit).

    A prefix episode is one sequence; an episode whose env changed the context (Trajectory.previous)
    gives one example per sequence, each with its own prompt, so SFT teaches exactly what each
    context of the episode showed the policy."""
    return [seq for demo in demos for seq in demo.sequences()]


def cap_repeats(
    sequences: Sequence[Trajectory], max_repeats: int, seed: int
) -> tuple[list[Trajectory], dict[tuple[int, ...], int]]:
    """At most `max_repeats` of the sequences whose policy tokens are identical; the rest dropped.

    A majority action repeated across episodes (memory's `Next.` on every distractor) would
    otherwise be most of what SFT teaches. Which copies stay is drawn by `seed`; the kept ones keep
    their order. Returns (kept, {policy token ids of each capped group: sequences dropped})."""
    if max_repeats < 1:
        raise ValueError(f"max_repeats must be >= 1, got {max_repeats}")
    groups: dict[tuple[int, ...], list[int]] = {}
    for index, seq in enumerate(sequences):
        groups.setdefault(tuple(t for t, m in zip(seq.input_ids, seq.loss_mask) if m), []).append(index)
    rng = random.Random(seed)
    dropped: set[int] = set()
    counts: dict[tuple[int, ...], int] = {}
    for policy_tokens, members in groups.items():
        if len(members) > max_repeats:
            dropped.update(rng.sample(members, len(members) - max_repeats))
            counts[policy_tokens] = len(members) - max_repeats
    return [seq for index, seq in enumerate(sequences) if index not in dropped], counts


def load_jsonl_demos(
    path: str | Path, chat_format: ChatFormat, max_tokens: int | None = None, limit_name: str = "max_tokens"
) -> list[Trajectory]:
    """Demonstrations from a JSONL file of conversations (format in the module docstring).

    Every line is checked first (rollout/demo_schema.py); a demonstration longer than `max_tokens`
    (the model's context, or a configured limit: `limit_name` says which) is refused, never cut."""
    demos = []
    path = Path(path)
    for line_number, line in utf8_lines(path, DemoError, max_bytes=MAX_LINE_BYTES):
        if not line.strip():
            continue
        where = f"{path}:{line_number}"
        try:
            record = loads_data(line)  # a repeated key or a lone surrogate: named with the file and line
        except NotUnicodeError as exc:
            raise DemoError(f"{where}: {exc}; fix the text there") from None
        except (ValueError, RecursionError) as exc:  # also: a repeated key, too deeply nested, integers too long
            message = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc) or type(exc).__name__
            raise DemoError(f"{where}: not valid JSON ({message}); each line must be one JSON object") from None
        check_demo_record(record, where)
        try:
            tools = [get_tool(name).schema for name in record.get("tools", [])]
            demo = trajectory_from_messages(chat_format, record["messages"], tools or None, env="jsonl", task_id=where)
        except (DemoError, ValueError, KeyError) as exc:
            raise DemoError(f"{where}: {exc}") from exc
        check_length(demo, max_tokens, where, limit_name)
        demos.append(demo)
    if not demos:
        raise DemoError(f"{path}: no demonstrations found")
    return demos


def check_length(demo: Trajectory, max_tokens: int | None, where: str, limit_name: str) -> None:
    """DemoError when any token sequence of `demo` is longer than `max_tokens` (None: no limit)."""
    longest = max(len(sequence) for sequence in demo.sequences())
    if max_tokens is not None and longest > max_tokens:
        raise DemoError(
            f"{where}: the demonstration is {longest} tokens, longer than {max_tokens} ({limit_name}); "
            "shorten or split the conversation, or remove it"
        )
