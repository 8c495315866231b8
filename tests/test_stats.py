"""trnfrontier.stats: its verdicts by hand, on planted differences, and at the power it promises
(the t distribution itself is scipy's)."""

from __future__ import annotations

import math
import random
import statistics

import pytest
from scipy.stats import t as student_t

from trnfrontier import stats


def test_identical_values_make_the_difference_exact() -> None:
    assert stats.welch([1.0, 1.0], [2.0, 2.0, 2.0]) == stats.Difference(1.0, 1.0, 1.0, 0.0, 3.0, "welch", 0.95)
    same = stats.paired([1.0, 2.0, 3.0], [1.5, 2.5, 3.5])
    assert (same.low, same.high, same.p_value, same.method) == (0.5, 0.5, 0.0, "paired")


def test_welch_by_hand() -> None:
    a, b = [1.0, 2.0, 3.0], [2.0, 4.0, 6.0, 8.0]
    d = stats.welch(a, b)
    va, vb = 1.0 / 3, (20.0 / 3) / 4  # var/n per side
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 3)
    t = 3.0 / math.sqrt(va + vb)
    assert d.difference == pytest.approx(3.0)
    assert d.df == pytest.approx(df)
    assert d.p_value == pytest.approx(2 * student_t.sf(t, df))
    assert d.half_width == pytest.approx(student_t.ppf(0.975, df) * math.sqrt(va + vb))
    assert d.method == "welch"


def test_a_planted_difference_is_found_and_an_equal_pair_is_not() -> None:
    rng = random.Random(7)
    a = [0.950 + rng.gauss(0, 0.0003) for _ in range(6)]
    b = [0.946 + rng.gauss(0, 0.0003) for _ in range(6)]
    found = stats.welch(a, b)
    assert found.p_value is not None and found.p_value < 0.001
    assert found.low is not None and found.high is not None and found.low < -0.004 + 0.0006 and found.high < 0
    assert found.low <= -0.004 <= found.high or abs(found.difference + 0.004) < 0.0005

    same = stats.welch(a, [v + rng.gauss(0, 0.0003) for v in a])
    assert same.p_value is not None and same.p_value > 0.05
    assert same.low is not None and same.high is not None and same.low < 0 < same.high


def test_interval_coverage_is_near_nominal() -> None:
    rng = random.Random(3)
    covered = 0
    trials = 400
    for _ in range(trials):
        a = [rng.gauss(0, 1) for _ in range(4)]
        b = [rng.gauss(0.5, 2) for _ in range(5)]
        d = stats.welch(a, b)
        covered += d.low <= 0.5 <= d.high  # type: ignore[operator]
    assert 0.90 <= covered / trials <= 0.99


def test_single_values_say_what_they_cannot_know() -> None:
    none = stats.welch([1.0], [1.2])
    assert none.method == "none" and none.p_value is None and none.low is None
    one_side = stats.welch([1.0], [1.2, 1.3, 1.25])
    assert one_side.method == "pooled-from-one-side" and one_side.df == 2
    assert stats.describe([3.0]).sd is None
    with pytest.raises(ValueError):
        stats.describe([])
    with pytest.raises(ValueError):
        stats.describe([1.0, math.nan])


def test_ratio_intervals() -> None:
    rng = random.Random(11)
    a = [100.0 * math.exp(rng.gauss(0, 0.01)) for _ in range(8)]
    b = [120.0 * math.exp(rng.gauss(0, 0.01)) for _ in range(8)]
    r = stats.ratio_interval(a, b)
    assert r.low is not None and r.high is not None and r.low < r.ratio < r.high
    assert 1.15 < r.low and r.high < 1.25 and r.p_value is not None and r.p_value < 1e-6
    with pytest.raises(ValueError):
        stats.ratio_interval([1.0, -1.0], [1.0, 2.0])


def test_seeds_to_resolve_matches_the_power_it_promises() -> None:
    n = stats.seeds_to_resolve(sd=0.0003, delta=0.0003)
    assert n is not None and 15 <= n <= 20  # normal approximation: 2 (1.96 + 0.84)^2 = 15.7
    assert stats.seeds_to_resolve(0.0003, 0.003) == 2  # ten spreads apart: the minimum
    assert stats.seeds_to_resolve(0.0003, 0.0006) < n  # type: ignore[operator]
    assert stats.seeds_to_resolve(1.0, 1e-6) is None
    # Simulated power at that n is near the 80 % asked for.
    rng = random.Random(5)
    hits = sum(
        stats.welch([rng.gauss(0, 1) for _ in range(n)], [rng.gauss(1, 1) for _ in range(n)]).p_value < 0.05  # type: ignore[operator]
        for _ in range(300)
    )
    assert 0.72 <= hits / 300 <= 0.92


def test_paired_removes_what_the_pair_shares() -> None:
    rng = random.Random(9)
    shared = [rng.gauss(0, 0.003) for _ in range(5)]  # seed-to-seed spread 10x the effect
    a = [0.95 + s + rng.gauss(0, 0.0001) for s in shared]
    b = [0.9497 + s + rng.gauss(0, 0.0001) for s in shared]
    unpaired, by_pair = stats.welch(a, b), stats.paired(a, b)
    assert unpaired.p_value > 0.5 and by_pair.p_value < 0.01  # type: ignore[operator]
    assert by_pair.method == "paired" and by_pair.df == 4
    diffs = [y - x for x, y in zip(a, b, strict=True)]
    assert by_pair.difference == pytest.approx(statistics.fmean(diffs))
    assert by_pair.half_width == pytest.approx(student_t.ppf(0.975, 4) * statistics.stdev(diffs) / math.sqrt(5))
    with pytest.raises(ValueError):
        stats.paired([1.0], [2.0])
    # One-sample planning needs about half the runs of two-sample planning at the same spread.
    two = stats.seeds_to_resolve(1.0, 1.0)
    one = stats.seeds_to_resolve(1.0, 1.0, paired=True)
    assert one is not None and two is not None and one < two and abs(one - two / 2) <= 2
