"""LR multiplier, progress and Muon momentum warm-up."""

from __future__ import annotations

import pytest

from trnfrontier.runtime.schedule import (
    lr_multiplier,
    muon_momentum,
    progress_from_steps,
    progress_from_time,
)


def test_warmup_flat_warmdown_shape_at_the_boundaries() -> None:
    f = lambda p: lr_multiplier(p, warmup_frac=0.1, warmdown_frac=0.4, final_lr_frac=0.1)  # noqa: E731
    assert f(0.0) == 0.0
    assert f(0.05) == pytest.approx(0.5)
    assert f(0.1) == 1.0
    assert f(0.35) == 1.0
    assert f(0.6) == 1.0  # warm-down starts after 1 - 0.4
    assert f(0.8) == pytest.approx(0.55)  # halfway from 1 down to 0.1
    assert f(1.0) == pytest.approx(0.1)
    assert f(1.7) == pytest.approx(0.1)  # clamped past the end
    assert f(-0.3) == 0.0  # clamped before the start


def test_schema_defaults_no_warmup_flat_then_to_zero() -> None:
    f = lambda p: lr_multiplier(p, 0.0, 0.4, 0.0)  # noqa: E731
    assert f(0.0) == 1.0
    assert f(0.6) == 1.0
    assert f(0.9) == pytest.approx(0.25)
    assert f(1.0) == 0.0


def test_no_warmdown_stays_flat_and_full_warmdown_is_linear() -> None:
    assert lr_multiplier(1.0, 0.0, 0.0, 0.0) == 1.0
    assert lr_multiplier(0.25, 0.0, 1.0, 0.0) == pytest.approx(0.75)


def test_multiplier_is_monotone_in_each_phase() -> None:
    ps = [i / 1000 for i in range(1001)]
    ys = [lr_multiplier(p, 0.2, 0.5, 0.05) for p in ps]
    assert all(b >= a for a, b in zip(ys[:200], ys[1:201], strict=True))
    assert all(b <= a for a, b in zip(ys[500:], ys[501:], strict=False))
    assert min(ys[1:]) >= 0.0 and max(ys) == 1.0


def test_bad_fractions_are_rejected() -> None:
    with pytest.raises(ValueError):
        lr_multiplier(0.5, 0.7, 0.4, 0.0)


def test_progress_from_time_and_steps() -> None:
    assert progress_from_time(0.0, 1800.0) == 0.0
    assert progress_from_time(900.0, 1800.0) == 0.5
    assert progress_from_time(2000.0, 1800.0) == 1.0
    assert progress_from_steps(0, 100) == 0.0
    assert progress_from_steps(25, 100) == 0.25
    assert progress_from_steps(150, 100) == 1.0
    with pytest.raises(ValueError):
        progress_from_time(1.0, 0.0)
    with pytest.raises(ValueError):
        progress_from_steps(1, 0)


def test_muon_momentum_warmup() -> None:
    assert muon_momentum(0, 0.85, 0.95, 300) == pytest.approx(0.85)
    assert muon_momentum(150, 0.85, 0.95, 300) == pytest.approx(0.90)
    assert muon_momentum(300, 0.85, 0.95, 300) == pytest.approx(0.95)
    assert muon_momentum(10_000, 0.85, 0.95, 300) == pytest.approx(0.95)
    assert muon_momentum(0, 0.85, 0.95, 0) == 0.95


def test_step_warmup_ramps_linearly_over_the_first_steps() -> None:
    from trnfrontier.runtime.schedule import step_warmup

    assert [step_warmup(s, 4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert step_warmup(0, 0) == 1.0
