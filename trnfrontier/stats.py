"""Small-sample statistics for deciding whether one configuration beats another.

Pure Python (stdlib ``math`` and ``statistics``): the tool must not need scipy for a
t-test. The Student t distribution comes from the regularized incomplete beta function
(continued fraction, Lentz's method); its quantile by bisection on the CDF, which is
monotone, so no starting guess can make it diverge.

Everything here is about *samples of scores* (one per seed, or one per timing round):
``describe`` summarises one sample, ``welch`` compares two means, ``ratio_interval`` two
positive quantities (tokens/s, step times) on the log scale, ``seeds_to_resolve`` says how
many runs per side would make a difference of a given size significant.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# Continued fractions converge in tens of terms for the arguments a t-test produces;
# 300 leaves a wide margin before giving up.
_MAX_TERMS = 300
_EPS = 3e-16
_TINY = 1e-300


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


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b) (modified Lentz), valid for x < (a+1)/(a+b+2)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, _MAX_TERMS + 1):
        m2 = 2 * m
        for numerator in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + numerator / c
            c = c if abs(c) > _TINY else _TINY
            step = d * c
            h *= step
        if abs(step - 1.0) < _EPS:
            return h
    raise ArithmeticError(f"incomplete beta did not converge for a={a}, b={b}, x={x}")


def regularized_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for a, b > 0 and 0 <= x <= 1."""
    if not (a > 0 and b > 0):
        raise ValueError("regularized_beta needs a > 0 and b > 0")
    if not 0.0 <= x <= 1.0:
        raise ValueError("regularized_beta needs 0 <= x <= 1")
    if x in (0.0, 1.0):
        return x
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    # The fraction converges fast on one side of the mean; use the symmetry on the other.
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_continued_fraction(a, b, x) / a
    return 1.0 - front * _beta_continued_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` (> 0, not necessarily whole) degrees of freedom."""
    if df <= 0:
        raise ValueError("degrees of freedom must be positive")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * regularized_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p (bisection: the CDF is monotone, so this cannot diverge)."""
    if not 0.0 < p < 1.0:
        raise ValueError("a quantile needs 0 < p < 1")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        low, high = high, high * 2.0
    for _ in range(200):
        mid = 0.5 * (low + high)
        if t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
        if high - low < 1e-12 * max(1.0, high):
            break
    return 0.5 * (low + high)


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
        df: float = known.n - 1
        method = "pooled-from-one-side"
    else:
        va, vb = sa.sd**2 / sa.n, sb.sd**2 / sb.n
        se = math.sqrt(va + vb)
        df = (va + vb) ** 2 / (va**2 / (sa.n - 1) + vb**2 / (sb.n - 1)) if va + vb > 0 else sa.n + sb.n - 2.0
        method = "welch"
    return _interval(diff, se, df, method, confidence)


def paired(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Difference:
    """The paired t-test and interval for mean(b - a), when ``a[i]`` and ``b[i]`` share
    what makes runs differ besides the change under test (the seed: same initial weights,
    same data order). Needs at least two pairs."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError("a paired comparison needs two or more pairs")
    d = describe([y - x for x, y in zip(a, b, strict=True)])
    assert d.sd is not None
    return _interval(d.mean, d.sd / math.sqrt(d.n), d.n - 1.0, "paired", confidence)


def _interval(diff: float, se: float, df: float, method: str, confidence: float) -> Difference:
    if se == 0.0:
        # Identical values within each side: the difference is exact (p 0 or 1).
        p = 1.0 if diff == 0.0 else 0.0
        return Difference(diff, diff, diff, p, df, method, confidence)
    t = diff / se
    p = 2.0 * (1.0 - t_cdf(abs(t), df))
    half = t_quantile(0.5 + confidence / 2.0, df) * se
    return Difference(diff, diff - half, diff + half, max(0.0, min(1.0, p)), df, method, confidence)


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float | None]:
    """(mean, half width of its t interval); None for one value."""
    s = describe(values)
    if s.sem is None:
        return s.mean, None
    return s.mean, t_quantile(0.5 + confidence / 2.0, s.n - 1) * s.sem


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


def bootstrap_ratio_interval(
    a: Sequence[float],
    b: Sequence[float],
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> Ratio:
    """Percentile bootstrap of mean(b)/mean(a): no distributional assumption, deterministic
    for a given seed. Needs at least two values per side."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError("a bootstrap interval needs at least two values per side")
    if any(v <= 0 for v in (*a, *b)):
        raise ValueError("a ratio interval needs positive values")
    rng = random.Random(seed)
    ratios = sorted(
        statistics.fmean(rng.choices(b, k=len(b))) / statistics.fmean(rng.choices(a, k=len(a)))
        for _ in range(resamples)
    )
    tail = (1.0 - confidence) / 2.0
    low = ratios[int(math.floor(tail * (resamples - 1)))]
    high = ratios[int(math.ceil((1.0 - tail) * (resamples - 1)))]
    return Ratio(statistics.fmean(b) / statistics.fmean(a), low, high, None, "bootstrap")


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

    def enough(n: int) -> bool:
        df = n - 1 if paired else 2 * n - 2
        factor = t_quantile(0.5 + confidence / 2.0, df) + t_quantile(power, df)
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
