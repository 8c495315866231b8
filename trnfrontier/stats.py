"""Small-sample statistics for deciding whether one configuration beats another.

The distributions and tests are scipy.stats' (Student's t: ``ttest_ind`` with unequal
variances, ``ttest_rel``, the t quantiles). What is the project's own is what to do with
the samples trnf has: one value on a side (the other side's spread stands for both), no
spread at all (nothing can be said), identical values (the difference is exact), ratios
on the log scale, and how many runs per side would resolve a difference.

Everything here is about *samples of scores* (one per seed, or one per timing round):
``describe`` summarises one sample, ``welch`` and ``paired`` compare two means,
``ratio_interval`` two positive quantities (tokens/s, step times) on the log scale,
``seeds_to_resolve`` says how many runs per side would make a difference of a given size
significant. scipy is imported when a comparison is made, not when trnf starts.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Summary:
    """One sample: its size, mean, sample standard deviation (n-1) and standard error."""

    n: int
    mean: float
    sd: float | None  # None for a single value: one run says nothing about the noise
    minimum: float
    maximum: float

    @property
    def sem(self) -> float | None:
        return None if self.sd is None else self.sd / math.sqrt(self.n)


def describe(values: Sequence[float]) -> Summary:
    """Mean and spread of one sample (at least one finite value)."""
    data = [float(v) for v in values]
    if not data:
        raise ValueError("an empty sample has no mean")
    if not all(math.isfinite(v) for v in data):
        raise ValueError("a sample with NaN or infinity has no mean")
    sd = statistics.stdev(data) if len(data) > 1 else None
    return Summary(len(data), statistics.fmean(data), sd, min(data), max(data))


# ------------------------------------------------------------------ the t distribution


def _scipy_stats() -> Any:
    from scipy import stats as scipy_stats

    return scipy_stats


def t_critical(confidence: float, df: float) -> float:
    """The two-sided critical value of Student's t: t with P(|T| <= t) = ``confidence``."""
    return float(_scipy_stats().t.ppf(0.5 + confidence / 2.0, df))


# ------------------------------------------------------------------ comparing two means


@dataclass(frozen=True)
class Difference:
    """mean(b) - mean(a) with a two-sided confidence interval and test."""

    difference: float
    low: float | None
    high: float | None
    p_value: float | None
    df: float | None
    method: str  # "welch", "pooled-from-one-side" or "none"
    confidence: float

    @property
    def half_width(self) -> float | None:
        return None if self.low is None or self.high is None else (self.high - self.low) / 2.0


def welch(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Difference:
    """Welch's t-test and interval for mean(b) - mean(a), degrees of freedom by
    Welch-Satterthwaite (no equal-variance assumption).

    With one value on one side, the other side's variance stands for both (the only noise
    estimate there is; ``method`` says so). With one value on each side there is no
    estimate of the noise at all, and the interval and p-value are None.
    """
    sa, sb = describe(a), describe(b)
    diff = sb.mean - sa.mean
    if sa.sd is None and sb.sd is None:
        return Difference(diff, None, None, None, None, "none", confidence)
    if sa.sd is None or sb.sd is None:
        known = sb if sa.sd is None else sa
        assert known.sd is not None
        se = known.sd * math.sqrt(1.0 / sa.n + 1.0 / sb.n)
        return _interval(diff, se, known.n - 1.0, "pooled-from-one-side", confidence)
    if sa.sd == 0.0 and sb.sd == 0.0:
        return _exact(diff, sa.n + sb.n - 2.0, "welch", confidence)
    result = _scipy_stats().ttest_ind(list(b), list(a), equal_var=False)
    return _tested(diff, result, "welch", confidence)


def paired(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Difference:
    """The paired t-test and interval for mean(b - a), when ``a[i]`` and ``b[i]`` share
    what makes runs differ besides the change under test (the seed: same initial weights,
    same data order). Needs at least two pairs."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError("a paired comparison needs two or more pairs")
    d = describe([y - x for x, y in zip(a, b, strict=True)])
    if d.sd == 0.0:
        return _exact(d.mean, d.n - 1.0, "paired", confidence)
    result = _scipy_stats().ttest_rel(list(b), list(a))
    return _tested(d.mean, result, "paired", confidence)


def _exact(diff: float, df: float, method: str, confidence: float) -> Difference:
    """No spread within either side (or within the pairs): the difference is exact, p 0 or 1."""
    p = 1.0 if diff == 0.0 else 0.0
    return Difference(diff, diff, diff, p, df, method, confidence)


def _tested(diff: float, result: Any, method: str, confidence: float) -> Difference:
    """A Difference from scipy's t-test result (its p-value, degrees of freedom and interval)."""
    interval = result.confidence_interval(confidence_level=confidence)
    return Difference(diff, float(interval.low), float(interval.high), float(result.pvalue), float(result.df), method, confidence)


def _interval(diff: float, se: float, df: float, method: str, confidence: float) -> Difference:
    """The t-test and interval of ``diff`` with standard error ``se`` on ``df`` degrees of freedom."""
    if se == 0.0:
        return _exact(diff, df, method, confidence)
    p = 2.0 * float(_scipy_stats().t.sf(abs(diff / se), df))
    half = t_critical(confidence, df) * se
    return Difference(diff, diff - half, diff + half, max(0.0, min(1.0, p)), df, method, confidence)


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float | None]:
    """(mean, half width of its t interval); None for one value."""
    s = describe(values)
    if s.sem is None:
        return s.mean, None
    return s.mean, t_critical(confidence, s.n - 1) * s.sem


# ------------------------------------------------------------------ ratios


@dataclass(frozen=True)
class Ratio:
    """A ratio b/a of two positive quantities with a confidence interval."""

    ratio: float
    low: float | None
    high: float | None
    p_value: float | None  # of "the ratio is 1"
    method: str


def ratio_interval(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Ratio:
    """Ratio of geometric means b/a: Welch on log values, back-transformed. Suited to
    throughputs and times, whose noise is multiplicative."""
    if any(v <= 0 for v in (*a, *b)):
        raise ValueError("a ratio interval needs positive values")
    d = welch([math.log(v) for v in a], [math.log(v) for v in b], confidence)
    low = None if d.low is None else math.exp(d.low)
    high = None if d.high is None else math.exp(d.high)
    return Ratio(math.exp(d.difference), low, high, d.p_value, f"log-{d.method}")


# ------------------------------------------------------------------ planning more runs


def seeds_to_resolve(
    sd: float,
    delta: float,
    confidence: float = 0.95,
    power: float = 0.8,
    limit: int = 10_000,
    paired: bool = False,
) -> int | None:
    """Runs per side for a two-sided t-test at ``confidence`` to detect a true difference
    ``delta`` with probability ``power``, when each run's score has spread ``sd`` (with
    ``paired``: when each pair's difference has spread ``sd``).

    The smallest n with n >= k sd^2 (t_{1-alpha/2, df} + t_{power, df})^2 / delta^2, where
    k = 2, df = 2n - 2 for two samples and k = 1, df = n - 1 for pairs (the normal
    approximation undercounts at the small n this is used for); the right side falls as n
    grows, so a binary search finds it. None when more than ``limit`` are needed."""
    if delta <= 0 or not math.isfinite(delta):
        raise ValueError("the difference to resolve must be positive")
    if sd < 0:
        raise ValueError("a spread cannot be negative")
    k = 1.0 if paired else 2.0
    t = _scipy_stats().t

    def enough(n: int) -> bool:
        df = n - 1 if paired else 2 * n - 2
        factor = float(t.ppf(0.5 + confidence / 2.0, df) + t.ppf(power, df))
        return n >= k * (sd * factor / delta) ** 2

    if enough(2):
        return 2
    if not enough(limit):
        return None
    low, high = 2, limit  # enough(low) is False, enough(high) is True
    while high - low > 1:
        mid = (low + high) // 2
        if enough(mid):
            high = mid
        else:
            low = mid
    return high
