"""The LR schedule and Muon's momentum warm-up, as plain functions of progress.

Progress is a fraction of the run in [0, 1]: in ``time`` mode the share of the usable
budget charged so far (the trainer uses ``BudgetClock.progress``, which leaves out the
checkpoint reserve; ``progress_from_time`` is the same ratio without one), so a slow
step can never leave a run at full LR when the clock runs out; in ``steps`` mode
``step / total_steps``.
"""

from __future__ import annotations


def _clamp01(x: float) -> float:
    return min(1.0, max(0.0, x))


def lr_multiplier(
    progress: float, warmup_frac: float, warmdown_frac: float, final_lr_frac: float
) -> float:
    """LR multiplier at ``progress``: linear warm-up from 0 to 1 over [0, warmup_frac],
    flat at 1, then linear warm-down from 1 to ``final_lr_frac`` over the last
    ``warmdown_frac``. Progress outside [0, 1] is clamped (past the end: final_lr_frac).
    """
    if warmup_frac < 0 or warmdown_frac < 0 or warmup_frac + warmdown_frac > 1.0:
        raise ValueError(
            f"need warmup_frac, warmdown_frac >= 0 with sum <= 1, got {warmup_frac}, {warmdown_frac}"
        )
    p = _clamp01(progress)
    if warmup_frac > 0 and p < warmup_frac:
        return p / warmup_frac
    warmdown_start = 1.0 - warmdown_frac
    if warmdown_frac == 0 or p <= warmdown_start:
        return 1.0
    remaining = (1.0 - p) / warmdown_frac  # 1 at the start of the warm-down, 0 at the end
    return remaining + (1.0 - remaining) * final_lr_frac


def progress_from_time(charged_seconds: float, budget_seconds: float) -> float:
    """Fraction of the training budget charged so far, clamped to [0, 1]."""
    if budget_seconds <= 0:
        raise ValueError(f"budget_seconds must be > 0, got {budget_seconds}")
    return _clamp01(charged_seconds / budget_seconds)


def progress_from_steps(step: int, total_steps: int) -> float:
    """Fraction of a fixed-step run done before ``step`` (0-based), clamped to [0, 1]."""
    if total_steps <= 0:
        raise ValueError(f"total_steps must be > 0, got {total_steps}")
    return _clamp01(step / total_steps)


def muon_momentum(step: int, start: float, end: float, warmup_steps: int) -> float:
    """Muon momentum at ``step``: linear from ``start`` to ``end`` over ``warmup_steps``
    steps, then ``end`` (immediately ``end`` when warmup_steps is 0)."""
    if warmup_steps <= 0:
        return end
    frac = _clamp01(step / warmup_steps)
    return (1.0 - frac) * start + frac * end


def step_warmup(step: int, warmup_steps: int) -> float:
    """LR ramp over the first ``warmup_steps`` optimizer steps: (step + 1) / warmup_steps
    for the 0-based ``step`` about to be taken, then 1 (always 1 when warmup_steps is 0).
    The trainer applies the smaller of this and ``lr_multiplier``."""
    if warmup_steps <= 0:
        return 1.0
    return min(1.0, (step + 1) / warmup_steps)
