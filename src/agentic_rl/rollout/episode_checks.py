"""Pure checks that training sees what inference sees, on episodes already in hand: no model, no
rollout. `agentic-rl audit` (evaluation/audit.py) runs them on oracle and freshly sampled episodes;
every GRPO and PPO run runs them on its first batch (training/start_audit.py). They live here, in
the rollout layer, so that training/ can use them without importing evaluation/ (docs/design.md
invariant 9: arrows point down).

  prefix_problem   rendering the conversation one turn further keeps the earlier rendering as an
                   exact token prefix, at every assistant turn of a token sequence
  mask_problem     the tokens with loss mask 1 are exactly the model's turns, in order, each once
  logprob_drift    |log π_sampler − log π_trainer| over the trained tokens

The first two return what is wrong and where (the first bad token), or None; `token_table` and
`mask_table` show the tokens around it. The tolerance of the drift where both sides run float32 is
rollout/config.py's FLOAT32_LOGPROB_TOLERANCE.

Shapes: T tokens of a sequence; B sequences in a batch.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any, NamedTuple, Sequence

import torch

from agentic_rl.models.chat_format import ChatFormat
from agentic_rl.rollout.trajectory import Trajectory


# ---------------------------------------------------------------------- prefixes


class PrefixProblem(NamedTuple):
    """Rendering `after` messages rewrites the rendering of the first `before`, first at `position`."""

    before: int
    after: int
    shorter: list[int]
    longer: list[int]
    position: int


def turn_cuts(messages: Sequence[dict[str, Any]], prompt: int) -> list[int]:
    """The message counts at which a sequence is rendered: before each of its assistant turns (the
    ones at index >= `prompt`, its context's length), and the whole conversation."""
    return [i for i, message in enumerate(messages) if message["role"] == "assistant" and i >= prompt] + [len(messages)]


def prefix_problem(
    chat_format: ChatFormat, messages: Sequence[dict[str, Any]], prompt: int, tools: Sequence[dict[str, Any]] | None
) -> PrefixProblem | None:
    """The first turn boundary where `chat_format.prompt_ids` of the conversation up to the next
    assistant turn does not start with its rendering up to this one, or None. Each cut is
    rendered once (a sequence of n turns costs n + 1 renderings).

    The earlier rendering is compared less the generation suffix that `enable_thinking: false`
    adds after each generation prompt (Qwen3's empty think block): the policy saw it, but a
    re-render drops it from the assistant turns it writes, which the engine allows for in the
    same way (`ChatFormat.observation_ids`). Without this, every multi-turn conversation with
    enable_thinking false failed at the think block."""
    cuts = turn_cuts(messages, prompt)
    renders = [chat_format.prompt_ids(list(messages[:cut]), tools) for cut in cuts]
    suffix = chat_format.encode(chat_format.generation_suffix) if chat_format.generation_suffix else []
    for (before, after), (shorter, longer) in zip(pairwise(cuts), pairwise(renders)):
        if suffix and shorter[len(shorter) - len(suffix) :] == suffix:
            shorter = shorter[: len(shorter) - len(suffix)]  # the turn's opening as a re-render writes it
        differs = first_difference(shorter, longer[: len(shorter)])
        if differs is not None:
            return PrefixProblem(before, after, shorter, longer, differs)
    return None


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where `a` and `b` differ (the shorter length if one is a prefix of the other), or None."""
    for position, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return position
    return None if len(a) == len(b) else min(len(a), len(b))


def token_table(chat_format: ChatFormat, a: Sequence[int], b: Sequence[int], at: int) -> list[str]:
    """The tokens of two renderings around position `at`, side by side."""
    rows = ["position  earlier rendering           later rendering"]
    for position in range(max(0, at - 3), min(max(len(a), len(b)), at + 4)):
        left = _show(chat_format, a, position)
        right = _show(chat_format, b, position)
        rows.append(f"{position:8d}  {left:26s}  {right}{'   <-- first difference' if position == at else ''}")
    return rows


def _show(chat_format: ChatFormat, ids: Sequence[int], position: int) -> str:
    if position >= len(ids):
        return "(end)"
    return f"{ids[position]:>6d} {chat_format.tokenizer.decode([ids[position]])!r}"[:26]


# ---------------------------------------------------------------------- masks


def mask_problem(chat_format: ChatFormat, trajectory: Trajectory) -> tuple[int, int, str] | None:
    """(token sequence, position in it of the first bad token, what is wrong), or None when the
    masks of the episode's sequences, oldest first, are exactly the model's turns in order.

    A masked run passes when it decodes to its assistant message (plus the end-of-turn marker the
    model generated). Only a run that does not is scanned token by token for the first bad one:
    decoding every prefix of a passing run would cost O(n²) decodes, and a prefix that ends inside
    a multi-byte character decodes to U+FFFD, which is no prefix of the message."""
    sequences = trajectory.sequences()
    runs = [
        (number, begin, end)
        for number, sequence in enumerate(sequences)
        for begin, end in masked_runs(sequence.loss_mask)
    ]
    turns = [m.get("content") or "" for m in trajectory.messages if m["role"] == "assistant"]
    if len(runs) != len(turns):
        number, begin, end = runs[len(turns)] if len(runs) > len(turns) else runs[-1] if runs else (0, 0, 0)
        return (
            number,
            begin if len(runs) > len(turns) else end,
            f"{len(runs)} masked runs for {len(turns)} assistant turns",
        )
    decode = chat_format.decode_turn
    for (number, begin, end), expected in zip(runs, turns):
        ids = sequences[number].input_ids
        content_end = end - 1 if ids[end - 1] in chat_format.stop_token_ids else end  # a generated end-of-turn is
        if decode(ids[begin:content_end]) == expected:  # masked, not message text
            continue
        for position in range(begin, content_end):
            if not expected.startswith(decode(ids[begin : position + 1])):
                return (
                    number,
                    position,
                    (
                        f"token {position} ({decode([ids[position]])!r}) has mask 1 but is not the model's "
                        f"text here (the turn reads {expected[:40]!r})"
                    ),
                )
        return (
            number,
            content_end,
            (
                f"the masked run [{begin}, {end}) stops before the turn does: it decodes to "
                f"{decode(ids[begin:content_end])[-30:]!r}, the turn ends {expected[-30:]!r}"
            ),
        )
    return None


def masked_runs(mask: Sequence[int]) -> list[tuple[int, int]]:
    """[begin, end) of every run of 1s in `mask`."""
    runs, start = [], None
    for position, bit in enumerate(list(mask) + [0]):
        if bit and start is None:
            start = position
        elif not bit and start is not None:
            runs.append((start, position))
            start = None
    return runs


def mask_table(chat_format: ChatFormat, trajectory: Trajectory, at: int) -> list[str]:
    """The tokens of one token sequence around position `at`, with their mask and sampler log-prob."""
    rows = ["position  token                         mask  sampler log-prob"]
    for position in range(max(0, at - 3), min(len(trajectory.input_ids), at + 4)):
        token = trajectory.input_ids[position]
        text = f"{token:>6d} {chat_format.tokenizer.decode([token])!r}"[:28]
        rows.append(
            f"{position:8d}  {text:28s}  {trajectory.loss_mask[position]:4d}  {trajectory.logprobs[position]:+.4f}"
            f"{'   <-- first bad token' if position == at else ''}"
        )
    return rows


# ---------------------------------------------------------------------- log-probs


def logprob_drift(trainer_logps: torch.Tensor, sampler_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """|log π_trainer − log π_sampler| at every mask-1 position of (B, T) inputs: 1-D, float64."""
    trained = mask.bool()  # (B, T)
    return (trainer_logps.detach().double() - sampler_logps.detach().double())[trained].abs()  # (N,)
