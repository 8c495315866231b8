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
from trnfrontier.contract.steplog import HEADER, StepLog, StepLogError, read_step_log
from trnfrontier.runtime import budget_rule
from trnfrontier.runtime.budget_rule import (
    BUDGET_SECONDS,
    STARTUP_CAP_SECONDS,
    STARTUP_STEPS_EXCLUDED,
)

# What starts a log without a header line when trnf launched the run that wrote it.
TRNF_LAUNCH = "trnf's launch of the run (the log has no header line)"


def documented_accounting(
    path: Path,
    budget: float = BUDGET_SECONDS,
    excluded_steps: int = STARTUP_STEPS_EXCLUDED,
    cap: float = STARTUP_CAP_SECONDS,
    *,
    log: StepLog | None = None,
) -> dict[str, Any]:
    """The documented formula over the last segment of the log at ``path`` (or of ``log``,
    already read), for a prepare.py without budget_accounting (the same keys as
    prepare.budget_accounting returns)."""
    run = (log or read_step_log(path)).last
    return budget_rule.account(run.start, run.boundaries, budget=budget, steps_excluded=excluded_steps, cap=cap)


def _theirs_reads(log: StepLog) -> bool:
    """Whether a prepare.py's own budget_accounting can read this log: only the format such
    a file writes (the project's: JSON {step, time} after a header, no console prefix)."""
    return log.start_source == HEADER and log.when == ("time",) and not log.text and not log.prefixed


def account(
    path: Path, prepare: ModuleType | None, launch: float | None = None, launch_source: str = TRNF_LAUNCH,
    *, log: StepLog | None = None,
) -> tuple[dict[str, Any], str]:
    """The accounting of ``path`` and which implementation produced it. The log is read
    (and its rules held: finite, time never backwards, ...) whoever computes the charge;
    ``launch`` starts a log without a header (``log``: already read so). The accounting
    says how the log was read (``step_log``) and where its start came from (``start_source``)."""
    log = log or read_step_log(path, launch, launch_source)
    read = {"step_log": log.describe(), "start_source": log.start_source, "start_time": log.last.start,
            "lower_bound": log.lower_bound}
    if prepare is not None and callable(getattr(prepare, "budget_accounting", None)) and _theirs_reads(log):
        try:
            return {**dict(prepare.budget_accounting(str(path))), **read}, "prepare.budget_accounting"
        except Exception as exc:  # the trusted file's own error types (PrepareError, ...): a bad log
            raise StepLogError(str(exc)) from None
    budget, excluded, cap = budget_rule.budget_of(prepare)
    how = (
        "the documented formula (prepare.py has no budget_accounting)"
        if not callable(getattr(prepare, "budget_accounting", None))
        else "the documented formula (prepare.py's budget_accounting reads only its own log format)"
    )
    return {**documented_accounting(path, budget, excluded, cap, log=log), **read}, how


def for_phase(
    accounting: dict[str, Any], how: str, phase: Phase, log: StepLog | None = None, prepare: ModuleType | None = None
) -> tuple[dict[str, Any], str]:
    """(``accounting`` judged against ``phase``'s rules, which implementation charged it).

    A prepare.py knows one phase's rules (this project's, like the kit's, Phase 1's:
    1,800 s); a Phase 2 run's charge is held to 14,400 s, and where ``phase``'s startup
    rules differ from ``prepare``'s constants, the last segment of ``log`` is charged again
    under the phase's (today Phase 2 assumes Phase 1's, so only the budget changes)."""
    if phase.number == DEFAULT_PHASE:
        return accounting, how
    startup = (phase.startup_steps_excluded, phase.startup_allowance_cap_seconds)
    if log is not None and startup != budget_rule.budget_of(prepare)[1:]:
        run = log.last
        recharged = budget_rule.account(run.start, run.boundaries, budget=phase.budget_seconds,
                                        steps_excluded=startup[0], cap=startup[1])
        return {**accounting, **recharged}, f"the documented formula under Phase {phase.number}'s startup rules"
    charged = float(accounting["charged_seconds"])
    budget = phase.budget_seconds
    return {**accounting, "budget_seconds": budget, "headroom_seconds": budget - charged, "over_budget": charged > budget}, how


def account_log(
    path: Path,
    prepare: ModuleType | None,
    phase: Phase = PHASES[DEFAULT_PHASE],
    launch: float | None = None,
    launch_source: str = TRNF_LAUNCH,
) -> tuple[dict[str, Any] | None, str]:
    """(accounting against ``phase``'s budget, which implementation) of the step log at
    ``path``, or (None, why there is none). A log trnf cannot read is said to be that (with
    the line and the shapes it reads), not blamed on the script that wrote it."""
    if not path.is_file():
        return None, no_step_log(path)
    try:
        log = read_step_log(path, launch, launch_source)
        accounting, how = account(path, prepare, launch, launch_source, log=log)
    except (StepLogError, OSError, ValueError, KeyError, TypeError) as exc:
        return None, unread_step_log(path, exc)
    return for_phase(accounting, how, phase, log, prepare)


def recorded_start(summary: dict[str, Any] | None) -> tuple[float | None, str]:
    """The start time a kit run recorded for a step log without a header line
    (summary.json ``step_log_start``: trnf's launch of the run) and its source; (None, "")
    when it recorded none or something that is not a finite time."""
    entry = (summary or {}).get("step_log_start")
    if not isinstance(entry, dict):
        return None, ""
    value, source = entry.get("time"), entry.get("source")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 <= value <= 1e12:
        return None, ""
    return float(value), f"{str(source)[:120]} (as summary.json records it)" if isinstance(source, str) else "summary.json's step_log_start"


def no_step_log(path: Path) -> str:
    """Why there is no step log at ``path`` (it does not exist), in the words every reader uses."""
    return (
        f"no step log at {path}: train.py never called prepare.record_step_boundary(), or its prepare.py "
        "wrote elsewhere than $NEURON_COMPETITION_R1_STEP_LOG"
    )


def unread_step_log(path: Path, exc: Exception) -> str:
    """A step log trnf could not read: said to be that, with the line and where the forms
    it reads are listed; never blamed on the script (it did call record_step_boundary)."""
    return f"step log {path} is in a form trnf does not read ({exc}); the forms it reads: docs/kit-contract.md"


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


# ---------------------------------------------------------------------------- what a run says of itself

# Keys in which a run's own documents state the seconds it charged (trnf's summary and
# checkpoint meta: charged_seconds; the kit's final.pt meta: budget_elapsed_before_save).
CHARGED_KEYS = ("charged_seconds", "budget_elapsed_before_save")
_STATEMENT_DEPTH = 8


def over_budget_statement(documents: dict[str, Any], budget: float) -> str | None:
    """The first statement, in any of a run's own documents (``where -> parsed JSON or a
    checkpoint's meta``), that it went over ``budget``: ``over_budget: true``, or a charge
    above the budget, at any depth (a kit's block, a checkpoint's meta). None when none says so.
    A run that says it ran over is over, whatever its step log shows."""
    def walk(value: Any, where: str, depth: int) -> str | None:
        if depth > _STATEMENT_DEPTH:
            return None
        if isinstance(value, dict):
            for key, item in value.items():
                path = f"{where}: {key}" if depth == 0 else f"{where}.{key}"
                if key == "over_budget" and item is True:
                    return f"{path} is true"
                number = item if isinstance(item, (int, float)) and not isinstance(item, bool) else None
                if key in CHARGED_KEYS and number is not None and (not math.isfinite(number) or number > budget):
                    return f"{path} is {float(number):g} s, over the {budget:g} s budget"
                found = walk(item, path, depth + 1)
                if found:
                    return found
        elif isinstance(value, list):
            for index, item in enumerate(value[:1000]):
                found = walk(item, f"{where}[{index}]", depth + 1)
                if found:
                    return found
        return None

    for where, document in documents.items():
        found = walk(document, where, 0)
        if found:
            return found
    return None
