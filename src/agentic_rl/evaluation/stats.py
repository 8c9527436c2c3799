"""Confidence intervals and paired comparisons for accuracies measured on a set of problems.

A learning claim here is a difference between two models on the SAME problems. Each problem
gives one number per model (1/0 for greedy pass@1, c/k for the share of k samples that were
correct), and the comparison works on the per-problem differences, so the problems' own
difficulty cancels out (a paired design needs far fewer problems than two independent ones).

    interval = wilson_interval(successes=23, n=100)            # (0.158, 0.321)
    result = paired_difference(a=[1, 0, 0, 1], b=[1, 1, 0, 1])  # b − a, with its 95% CI

Methods:
  * A single accuracy of binary outcomes: the Wilson score interval (well behaved at 0% and
    100%, unlike the normal approximation, which gives [0, 0] for 0/100).
  * A mean of per-problem fractions (sampled accuracy, pass@k): the percentile bootstrap over
    problems (the k samples of one problem are not independent, so problems are resampled).
  * A paired difference: the percentile bootstrap of the mean per-problem difference
    (10,000 resamples, a fixed seed, so the same inputs always give the same interval), and for
    binary outcomes also the exact McNemar test: under "no difference", each discordant problem
    (solved by one model only) is equally likely to favour either, so the two-sided p-value is
    that of a Binomial(discordant, 1/2).
  * A difference between runs (e.g. three GRPO seeds against their SFT start): each run is one
    number (its accuracy on the problems) and the runs are the units, so the interval says how far
    another seed could land, which resampling problems does not. One A run: Student's t-interval
    of the differences B_s − A. Several A runs: Welch's two-sample t-interval. With three runs,
    t(2) = 4.30: such an interval is wide, and it is the honest one for "over 3 seeds".
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

Z_95 = 1.959963984540054
"""The 97.5% quantile of the standard normal: a two-sided 95% interval."""
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval for a binomial proportion successes / n."""
    if n <= 0 or not 0 <= successes <= n:
        raise ValueError(f"wilson_interval needs n > 0 and 0 <= successes <= n, got successes={successes}, n={n}")
    p = successes / n
    denominator = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1.0 - p) / n + z * z / (4 * n * n)) / denominator
    low = 0.0 if successes == 0 else max(0.0, centre - half)  # exact at the ends, not 1e-17 off
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def bootstrap_mean_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean of per-problem values (problems resampled)."""
    data = _as_array(values, "values")
    means = _bootstrap_means(data)
    return _percentiles(means, level)


def accuracy_interval(values: Sequence[float]) -> tuple[float, float]:
    """95% interval of a per-problem accuracy: Wilson when every value is 0 or 1, else bootstrap."""
    data = _as_array(values, "values")
    if np.all((data == 0.0) | (data == 1.0)):
        return wilson_interval(int(data.sum()), data.size)
    return bootstrap_mean_interval(data)


@dataclasses.dataclass(frozen=True)
class PairedDifference:
    """B − A on the same problems."""

    n: int
    """Problems compared (runs on the B side, for `run_level_difference`)."""
    mean_a: float
    mean_b: float
    difference: float
    """mean(B) − mean(A), in accuracy units (0.05 = 5 points)."""
    ci_low: float
    ci_high: float
    """95% percentile-bootstrap interval of the difference."""
    b_better: int
    """Problems where B scored higher than A."""
    a_better: int
    """Problems where A scored higher than B."""
    mcnemar_p: float | None
    """Exact two-sided McNemar p-value (binary outcomes only, else None)."""

    @property
    def significant(self) -> bool:
        """The 95% interval excludes 0."""
        return self.ci_low > 0.0 or self.ci_high < 0.0

    def verdict(self) -> str:
        if self.ci_low > 0.0:
            return "B better"
        if self.ci_high < 0.0:
            return "A better"
        return "within noise"

    def as_dict(self) -> dict[str, float | int | str | None]:
        return {**dataclasses.asdict(self), "verdict": self.verdict()}


def paired_difference(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> PairedDifference:
    """Compare two models' per-problem scores (same problems, same order): B − A with its CI."""
    left, right = _as_array(a, "a"), _as_array(b, "b")
    if left.shape != right.shape:
        raise ValueError(
            f"paired_difference needs the same problems on both sides: got {left.size} and {right.size} scores"
        )
    differences = right - left  # (n,)
    low, high = _percentiles(_bootstrap_means(differences), level)
    binary = bool(np.all(np.isin(left, (0.0, 1.0))) and np.all(np.isin(right, (0.0, 1.0))))
    b_better, a_better = int((differences > 0).sum()), int((differences < 0).sum())
    return PairedDifference(
        n=int(left.size),
        mean_a=float(left.mean()),
        mean_b=float(right.mean()),
        difference=float(differences.mean()),
        ci_low=low,
        ci_high=high,
        b_better=b_better,
        a_better=a_better,
        mcnemar_p=mcnemar_exact(b_better, a_better) if binary else None,
    )


def run_level_difference(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> PairedDifference:
    """B − A with runs as the units: `a` and `b` hold one accuracy per run (e.g. per seed).

    One A run (the common start, e.g. SFT): the t-interval of the differences b_s − a with
    len(b) − 1 degrees of freedom. Several: Welch's interval (unequal variances, Welch-Satterthwaite
    degrees of freedom). B needs at least two runs. In the result, n counts B's runs and
    b_better / a_better count B's runs above / below A's mean; McNemar does not apply (None)."""
    left, right = _as_array(a, "a"), _as_array(b, "b")
    if right.size < 2:
        raise ValueError(f"a run-level interval needs at least two B runs, got {right.size}")
    difference = float(right.mean() - left.mean())
    if left.size == 1:
        variance, df = right.var(ddof=1) / right.size, right.size - 1.0
    else:
        share_a, share_b = left.var(ddof=1) / left.size, right.var(ddof=1) / right.size
        variance = share_a + share_b
        df = variance**2 / (share_a**2 / (left.size - 1) + share_b**2 / (right.size - 1)) if variance > 0 else math.inf
    half = (student_t_quantile(0.5 + level / 2.0, df) if math.isfinite(df) else 0.0) * math.sqrt(variance)
    return PairedDifference(
        n=int(right.size),
        mean_a=float(left.mean()),
        mean_b=float(right.mean()),
        difference=difference,
        ci_low=difference - half,
        ci_high=difference + half,
        b_better=int((right > left.mean()).sum()),
        a_better=int((right < left.mean()).sum()),
        mcnemar_p=None,
    )


def student_t_quantile(probability: float, df: float) -> float:
    """The `probability` quantile (in (0.5, 1)) of Student's t with `df` degrees of freedom, which
    may be fractional (Welch): bisection on the CDF, whose density is integrated by Simpson's rule
    from 0 (2,000 panels). Within 1e-4 of the tables (t(2) at 0.975 is 4.303)."""
    if not 0.5 < probability < 1.0 or not df > 0:
        raise ValueError(f"need 0.5 < probability < 1 and df > 0, got {probability} and {df}")
    log_scale = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def cdf(x: float) -> float:
        grid = np.linspace(0.0, x, 4001)  # 2,000 Simpson panels
        density = np.exp(log_scale - (df + 1) / 2 * np.log1p(grid**2 / df))
        weights = np.ones_like(grid)
        weights[1:-1:2], weights[2:-1:2] = 4.0, 2.0
        return 0.5 + float((weights * density).sum()) * (x / 4000) / 3.0

    low, high = 0.0, 1.0
    while cdf(high) < probability:
        low, high = high, high * 2.0
    for _ in range(50):
        middle = (low + high) / 2.0
        low, high = (middle, high) if cdf(middle) < probability else (low, middle)
    return (low + high) / 2.0


def mcnemar_exact(b_only: int, a_only: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts (solved by only B, only A)."""
    discordant = b_only + a_only
    if discordant == 0:
        return 1.0
    tail = sum(math.comb(discordant, i) for i in range(min(b_only, a_only) + 1)) / 2.0**discordant
    return min(1.0, 2.0 * tail)


def _as_array(values: Sequence[float], name: str) -> np.ndarray:
    data = np.asarray(values, dtype=np.float64)
    if data.ndim != 1 or data.size == 0:
        raise ValueError(f"{name}: need a non-empty list of per-problem scores, got shape {data.shape}")
    if not np.all(np.isfinite(data)):
        raise ValueError(f"{name}: per-problem scores must be finite numbers")
    return data


def _bootstrap_means(data: np.ndarray) -> np.ndarray:
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    picks = rng.integers(0, data.size, size=(BOOTSTRAP_RESAMPLES, data.size))  # (R, n) problem indices
    return data[picks].mean(axis=1)  # (R,)


def _percentiles(samples: np.ndarray, level: float) -> tuple[float, float]:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.percentile(samples, [tail, 100.0 - tail])
    return float(low), float(high)
