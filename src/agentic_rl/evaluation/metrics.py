"""Evaluation metrics over episodes: pass@k, maj@k and the episode statistics.

pass@k uses the unbiased estimator of Chen et al. (2021): with n samples of which c are
correct, pass@k = 1 − C(n−c, k) / C(n, k), the probability that k of the n samples, drawn
without replacement, contain at least one correct answer.

maj@k takes the most frequent final answer among k samples (answers without a parseable
final answer do not vote). Ties are scored by their expectation under a uniform tie-break:
with m answers tied for the top count, of which j are correct, maj@k = j / m. This is
deterministic and does not depend on sample order.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Callable, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with n samples, c correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def maj_at_k(
    answers: Sequence[str | None], is_correct: Callable[[str], bool], canonical: Callable[[str], str] = str
) -> float:
    """Majority-vote accuracy of one problem's sampled answers (ties: expected value, see module doc)."""
    votes = Counter(canonical(a) for a in answers if a is not None)
    if not votes:
        return 0.0
    top = max(votes.values())
    tied = [answer for answer, count in votes.items() if count == top]
    return sum(1.0 for answer in tied if is_correct(answer)) / len(tied)


def mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else float("nan")
