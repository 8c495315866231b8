"""The competition's budget rule, the one copy outside the trusted prepare.py.

prepare.py (``budget_accounting``) is the specification; this module restates it for the
places that need it without one: the trainer's live clock (``clock.BudgetClock``) and the
reading of a step-boundary log when the trusted prepare.py has no ``budget_accounting``
(verify, package, kit runs). The numbers default to the competition's constants, which a
prepare.py's ``TRAIN_*`` constants override where they exist::

    startup  = t[first boundary with step >= steps_excluded - 1] - start_time
               (steps are the kit's 0-based indexes: steps 0-4 are startup, the clock
               starts when index 4 completes; all of the run when it has fewer steps)
    excluded = min(startup, cap)          # startup beyond the cap is charged
    charged  = (t[last boundary] - start_time) - excluded
    over_budget = charged > budget
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# prepare.py's TRAIN_TIME_BUDGET_SECONDS, TRAIN_STARTUP_STEPS_EXCLUDED,
# TRAIN_STARTUP_ALLOWANCE_CAP_SECONDS: the fallback when a prepare.py does not say.
BUDGET_SECONDS = 1800.0
STARTUP_STEPS_EXCLUDED = 5
STARTUP_CAP_SECONDS = 900.0


def excluded_startup(startup_seconds: float, cap_seconds: float) -> float:
    """The part of startup that is not charged: all of it up to the cap."""
    return min(startup_seconds, cap_seconds)


def budget_of(prepare: Any) -> tuple[float, int, float]:
    """(budget, steps excluded, startup cap) from a prepare module's constants, each
    falling back to the competition's when the module (or the constant) is missing."""
    return (
        float(getattr(prepare, "TRAIN_TIME_BUDGET_SECONDS", BUDGET_SECONDS)),
        int(getattr(prepare, "TRAIN_STARTUP_STEPS_EXCLUDED", STARTUP_STEPS_EXCLUDED)),
        float(getattr(prepare, "TRAIN_STARTUP_ALLOWANCE_CAP_SECONDS", STARTUP_CAP_SECONDS)),
    )


def account(
    start: float,
    boundaries: Sequence[tuple[int, float]],
    *,
    budget: float = BUDGET_SECONDS,
    steps_excluded: int = STARTUP_STEPS_EXCLUDED,
    cap: float = STARTUP_CAP_SECONDS,
) -> dict[str, Any]:
    """The rule above over one run's ``(step, time)`` boundaries, with the keys
    ``prepare.budget_accounting`` returns."""
    last = boundaries[-1][1] if boundaries else start
    after = [t for step, t in boundaries if step >= steps_excluded - 1]
    startup = (after[0] if after else last) - start
    excluded = excluded_startup(startup, cap)
    charged = (last - start) - excluded
    return {
        "start_time": start,
        "steps": boundaries[-1][0] + 1 if boundaries else 0,  # completed steps
        "total_seconds": last - start,
        "startup_seconds": startup,
        "excluded_seconds": excluded,
        "charged_seconds": charged,
        "budget_seconds": budget,
        "headroom_seconds": budget - charged,
        "over_budget": charged > budget,
    }
