"""The budget check: the step-boundary log, charged under the organisers' accounting.

When the trusted prepare.py provides ``budget_accounting(path)`` it is used as is: the
organisers' own arithmetic is the spec. Without it (an older or foreign prepare.py), the
documented formula (``trnfrontier.runtime.budget_rule``) is applied to the last process's
segment of the log, read by ``contract.steplog`` (a resumed run's log has one segment per
process: ``resumed_charge``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import ModuleType
from typing import Any

from trnfrontier.contract.phases import DEFAULT_PHASE, PHASES, Phase
from trnfrontier.contract.steplog import StepLog, StepLogError, read_step_log
from trnfrontier.runtime import budget_rule
from trnfrontier.runtime.budget_rule import (
    BUDGET_SECONDS,
    STARTUP_CAP_SECONDS,
    STARTUP_STEPS_EXCLUDED,
)


def documented_accounting(
    path: Path,
    budget: float = BUDGET_SECONDS,
    excluded_steps: int = STARTUP_STEPS_EXCLUDED,
    cap: float = STARTUP_CAP_SECONDS,
) -> dict[str, Any]:
    """The documented formula over the log at ``path``, for a prepare.py without
    budget_accounting (the same keys as prepare.budget_accounting returns)."""
    run = read_step_log(path).last
    return budget_rule.account(run.start, run.boundaries, budget=budget, steps_excluded=excluded_steps, cap=cap)


def account(path: Path, prepare: ModuleType | None) -> tuple[dict[str, Any], str]:
    """The accounting of ``path`` and which implementation produced it."""
    if prepare is not None and callable(getattr(prepare, "budget_accounting", None)):
        try:
            return dict(prepare.budget_accounting(str(path))), "prepare.budget_accounting"
        except Exception as exc:  # the trusted file's own error types (PrepareError, ...): a bad log
            raise StepLogError(str(exc)) from None
    budget, excluded, cap = budget_rule.budget_of(prepare)
    return documented_accounting(path, budget, excluded, cap), "the documented formula (prepare.py has no budget_accounting)"


def for_phase(accounting: dict[str, Any], phase: Phase) -> dict[str, Any]:
    """``accounting`` judged against ``phase``'s budget. A prepare.py knows one budget (this
    project's, like the kit's, Phase 1's 1,800 s); a Phase 2 run's charge is held to 14,400."""
    if phase.number == DEFAULT_PHASE:
        return accounting
    charged = float(accounting["charged_seconds"])
    budget = phase.budget_seconds
    return {**accounting, "budget_seconds": budget, "headroom_seconds": budget - charged, "over_budget": charged > budget}


def account_log(
    path: Path, prepare: ModuleType | None, phase: Phase = PHASES[DEFAULT_PHASE]
) -> tuple[dict[str, Any] | None, str]:
    """(accounting against ``phase``'s budget, which implementation) of the step log at
    ``path``, or (None, why there is none)."""
    if not path.is_file():
        return None, "no step log: train.py never called prepare.record_step_boundary()"
    try:
        accounting, how = account(path, prepare)
    except (StepLogError, OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"step log unusable: {exc}"
    return for_phase(accounting, phase), how


# ---------------------------------------------------------------------------- every source

AGREE_SECONDS = 5.0
AGREE_FRACTION = 0.02


def resumed_charge(log: StepLog, prepare: ModuleType | None) -> float:
    """A resumed run's charge: every segment in full, less the first segment's startup
    (under the budget rule, capped); a resumed process's startup is charged."""
    _, steps_excluded, cap = budget_rule.budget_of(prepare)
    total = sum((s.boundaries[-1][1] if s.boundaries else s.start) - s.start for s in log.segments)
    first = budget_rule.account(log.segments[0].start, log.segments[0].boundaries, steps_excluded=steps_excluded, cap=cap)
    return total - float(first["excluded_seconds"])


def _agree(a: float, b: float) -> bool:
    return abs(a - b) <= max(AGREE_SECONDS, AGREE_FRACTION * max(abs(a), abs(b)))


def trainer_log_charge(path: Path) -> tuple[float | None, bool]:
    """(the last charged_seconds the trainer logged, whether any record says over_budget)."""
    charged: float | None = None
    over = False
    if not path.is_file():
        return None, False
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                continue
            if not isinstance(record, dict):
                continue
            over = over or record.get("over_budget") is True
            value = record.get("charged_seconds")
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                charged = float(value)
    return charged, over


def cross_check(charged: float, budget: float, segments: int, summary: dict[str, Any] | None, trainer: tuple[float | None, bool]) -> str | None:
    """Why the summary or the trainer log disagrees with the step log's ``charged``, or is over budget; None when all agree."""
    summary = summary or {}
    if summary.get("over_budget") is True:
        return "logs/summary.json says over_budget: true"
    if trainer[1]:
        return "logs/metrics.jsonl has a record with over_budget: true"
    claimed = summary.get("charged_seconds")
    if isinstance(claimed, (int, float)) and not isinstance(claimed, bool):
        if claimed > budget:
            return f"logs/summary.json charges {claimed:.1f} s, over the {budget:g} s budget"
        if segments == 1 and not _agree(float(claimed), charged):
            return f"logs/summary.json charges {claimed:.1f} s but the step log {charged:.1f} s"
    if trainer[0] is not None:
        if trainer[0] > budget:
            return f"logs/metrics.jsonl charges {trainer[0]:.1f} s, over the {budget:g} s budget"
        if segments == 1 and not _agree(trainer[0], charged):
            return f"logs/metrics.jsonl charges {trainer[0]:.1f} s but the step log {charged:.1f} s"
    resumed = summary.get("resumed_from")
    if segments > 1 and not resumed:
        return f"the step log has {segments} process segments (a resumed run) but logs/summary.json records no resume (resumed_from)"
    if resumed and segments == 1:
        return f"logs/summary.json records a resume from {str(resumed)[:80]} but the step log holds one segment: the earlier time is not in the archive"
    return None
