"""The budget check: the step-boundary log, charged under the organisers' accounting.

When the trusted prepare.py provides ``budget_accounting(path)`` it is used as is: the
organisers' own arithmetic is the spec. Without it (an older or foreign prepare.py), the
documented formula (``trnfrontier.runtime.budget_rule``) is applied to the same log format::

    {"header": true, "start_time": <process start, s>, "pid": ...}   one per process; the last one counts
    {"step": <steps completed>, "time": <s>}                          one per recorded boundary
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import ModuleType
from typing import Any

from trnfrontier.runtime import budget_rule
from trnfrontier.runtime.budget_rule import (
    BUDGET_SECONDS,
    STARTUP_CAP_SECONDS,
    STARTUP_STEPS_EXCLUDED,
)


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
    """The documented formula over the log at ``path``, for a prepare.py without
    budget_accounting (the same keys as prepare.budget_accounting returns)."""
    start, boundaries = read_boundaries(path)
    return budget_rule.account(start, boundaries, budget=budget, steps_excluded=excluded_steps, cap=cap)


def account(path: Path, prepare: ModuleType | None) -> tuple[dict[str, Any], str]:
    """The accounting of ``path`` and which implementation produced it."""
    if prepare is not None and callable(getattr(prepare, "budget_accounting", None)):
        try:
            return dict(prepare.budget_accounting(str(path))), "prepare.budget_accounting"
        except Exception as exc:  # the trusted file's own error types (PrepareError, ...): a bad log
            raise BudgetLogError(str(exc)) from None
    budget, excluded, cap = budget_rule.budget_of(prepare)
    return documented_accounting(path, budget, excluded, cap), "the documented formula (prepare.py has no budget_accounting)"


def account_log(path: Path, prepare: ModuleType | None) -> tuple[dict[str, Any] | None, str]:
    """(accounting, which implementation) of the step log at ``path``, or (None, why there is none)."""
    if not path.is_file():
        return None, "no step log: train.py never called prepare.record_step_boundary()"
    try:
        return account(path, prepare)
    except (BudgetLogError, OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"step log unusable: {exc}"
