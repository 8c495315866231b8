"""The budget check: the step-boundary log, charged under the organisers' accounting.

When the trusted prepare.py provides ``budget_accounting(path)`` it is used as is: the
organisers' own arithmetic is the spec. Without it (an older or foreign prepare.py), the
same documented formula is applied to the same log format::

    {"header": true, "start_time": <process start, s>, "pid": ...}   one per process; the last one counts
    {"step": <steps completed>, "time": <s>}                          one per recorded boundary

    startup  = t[first boundary with step >= TRAIN_STARTUP_STEPS_EXCLUDED] - start_time
               (all of the run when it has fewer steps)
    charged  = (t[last boundary] - start_time) - min(startup, TRAIN_STARTUP_ALLOWANCE_CAP_SECONDS)
    over_budget = charged > TRAIN_TIME_BUDGET_SECONDS
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import ModuleType
from typing import Any

BUDGET_SECONDS = 1800.0
STARTUP_STEPS_EXCLUDED = 5
STARTUP_CAP_SECONDS = 900.0


class BudgetLogError(ValueError):
    pass


def read_boundaries(path: Path) -> tuple[float, list[tuple[int, float]]]:
    """The start time and the boundaries of the last run (after the last header line)."""
    start: float | None = None
    boundaries: list[tuple[int, float]] = []
    with open(path, encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                if record.get("header"):
                    start, boundaries = float(record["start_time"]), []
                    continue
                step, t = int(record["step"]), float(record["time"])
            except (json.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError):
                raise BudgetLogError(f"line {lineno} is neither a header nor {{\"step\": int, \"time\": seconds}}") from None
            if not math.isfinite(t):
                raise BudgetLogError(f"line {lineno} has a non-finite time")
            boundaries.append((step, t))
    if start is None or not math.isfinite(start):
        raise BudgetLogError("no header line with the process start time")
    return start, boundaries


def documented_accounting(
    path: Path,
    budget: float = BUDGET_SECONDS,
    excluded_steps: int = STARTUP_STEPS_EXCLUDED,
    cap: float = STARTUP_CAP_SECONDS,
) -> dict[str, Any]:
    """The formula in the module docstring, for a prepare.py without budget_accounting
    (the same keys as prepare.budget_accounting returns)."""
    start, boundaries = read_boundaries(path)
    last = boundaries[-1][1] if boundaries else start
    after = [t for step, t in boundaries if step >= excluded_steps]
    startup = (after[0] if after else last) - start
    excluded = min(startup, cap)
    charged = (last - start) - excluded
    return {
        "start_time": start,
        "steps": boundaries[-1][0] if boundaries else 0,
        "total_seconds": last - start,
        "startup_seconds": startup,
        "excluded_seconds": excluded,
        "charged_seconds": charged,
        "budget_seconds": budget,
        "headroom_seconds": budget - charged,
        "over_budget": charged > budget,
    }


def account(path: Path, prepare: ModuleType | None) -> tuple[dict[str, Any], str]:
    """The accounting of ``path`` and which implementation produced it."""
    if prepare is not None and callable(getattr(prepare, "budget_accounting", None)):
        try:
            return dict(prepare.budget_accounting(str(path))), "prepare.budget_accounting"
        except Exception as exc:  # the trusted file's own error types (PrepareError, ...): a bad log
            raise BudgetLogError(str(exc)) from None
    budget = float(getattr(prepare, "TRAIN_TIME_BUDGET_SECONDS", BUDGET_SECONDS))
    excluded = int(getattr(prepare, "TRAIN_STARTUP_STEPS_EXCLUDED", STARTUP_STEPS_EXCLUDED))
    cap = float(getattr(prepare, "TRAIN_STARTUP_ALLOWANCE_CAP_SECONDS", STARTUP_CAP_SECONDS))
    return documented_accounting(path, budget, excluded, cap), "the documented formula (prepare.py has no budget_accounting)"


def account_log(path: Path, prepare: ModuleType | None) -> tuple[dict[str, Any] | None, str]:
    """(accounting, which implementation) of the step log at ``path``, or (None, why there is none)."""
    if not path.is_file():
        return None, "no step log: train.py never called prepare.record_step_boundary()"
    try:
        return account(path, prepare)
    except (BudgetLogError, OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"step log unusable: {exc}"
