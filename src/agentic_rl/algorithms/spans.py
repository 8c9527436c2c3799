"""Per-turn values onto token positions: the one helper GRPO's turn credit and PPO's token rewards
share. Pure tensor code.

    row tokens   p p p [a a a] o o [a a] pad        (p prompt, a policy turn, o observation)
    spans              [2, 5)         [7, 9)
    on="every"   0 0 0  v0 v0 v0 0 0 v1 v1 0        GRPO: a turn's advantage on each of its tokens
    on="last"    0 0 0  0  0  v0 0 0 0  v1 0        PPO: a turn's reward on its last token
"""

from __future__ import annotations

from typing import Literal, Sequence

import torch


def spread_over_spans(
    values: Sequence[Sequence[float]],
    spans: Sequence[Sequence[object]],
    num_tokens: int,
    on: Literal["every", "last"],
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """(B, T) `dtype`, 0 off the spans: row b's k-th value on the tokens of its k-th span.

    Args:
        values: B ragged lists, one value per policy turn; an empty list leaves its row all 0
            (a row that is not trained, e.g. a failed episode).
        spans: B lists of the policy turns' half-open token ranges, as (start, end) tuples or
            objects with .start/.end (`Trajectory.policy_spans`).
        num_tokens: T, the padded length of the batch.
        on: "every" token of the span, or its "last" token.
    """
    if len(values) != len(spans):
        raise ValueError(f"{len(values)} rows of turn values but {len(spans)} of spans")
    out = torch.zeros(len(values), num_tokens, dtype=dtype)  # (B, T)
    for row, (row_values, row_spans) in enumerate(zip(values, spans)):
        if row_values and len(row_values) != len(row_spans):
            raise ValueError(f"row {row}: {len(row_values)} turn values for {len(row_spans)} policy turns")
        for value, span in zip(row_values, row_spans):
            start, end = (span.start, span.end) if hasattr(span, "start") else span
            if not 0 <= start < end <= num_tokens:
                raise ValueError(f"row {row}: policy span [{start}, {end}) is empty or outside the {num_tokens} tokens")
            if on == "every":
                out[row, start:end] = value
            else:
                out[row, end - 1] += value
    return out
