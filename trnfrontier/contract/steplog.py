"""The step log: what ``prepare.record_step_boundary`` appends, read one way only.

Every reader (the budget check, a kit run's per-step charge, the dry run's count of steps)
goes through ``read_step_log``, so the rules cannot drift apart. The format (the project's
prepare.py writes it; ``docs/kit-contract.md``)::

    {"header": true, "start_time": <process start, s>, "pid": ...}   one per process
    {"step": <0-based index of the step completed>, "time": <s>}       one per boundary

A resumed run appends a header per process, so the log is a list of segments, one per
header; the budget of a single run counts the last one. Refused, with the line named:
a line that is neither a header nor a boundary (including JSON nested too deep to
read), a boundary before any header, a start time or a time that is not a finite
number, and a log with no header at all.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

Boundary = tuple[int, float]  # (0-based index of the step completed, time in seconds)


class StepLogError(ValueError):
    """The step log cannot be read as one; the message names the line and why."""


@dataclass(frozen=True)
class Segment:
    """One process's part of the log: its start time and the boundaries it recorded, in order."""

    start: float
    boundaries: tuple[Boundary, ...]


@dataclass(frozen=True)
class StepLog:
    """Every segment of a step log, in order (at least one)."""

    segments: tuple[Segment, ...]

    @property
    def last(self) -> Segment:
        """The last process's segment: the one run a budget check of a single run counts."""
        return self.segments[-1]


_LINE_SHAPE = 'neither a header nor {"step": int, "time": seconds}'


def _finite(value: object, lineno: int, what: str) -> float:
    number = float(value)  # type: ignore[arg-type]
    if not math.isfinite(number):
        raise StepLogError(f"line {lineno} has a non-finite {what}")
    return number


def _numbered_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based number, text) of each line, streamed: a long log is never held whole."""
    with open(path, encoding="utf-8") as handle:
        try:
            yield from enumerate(handle, 1)
        except UnicodeDecodeError:
            raise StepLogError("not UTF-8 text") from None


def read_step_log(path: Path) -> StepLog:
    """The segments of the step log at ``path`` (see the module docstring for the rules);
    OSError when it cannot be opened, StepLogError when it is not a step log."""
    segments: list[tuple[float, list[Boundary]]] = []
    for lineno, line in _numbered_lines(path):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if record.get("header"):
                segments.append((_finite(record["start_time"], lineno, "start time"), []))
                continue
            step, t = int(record["step"]), _finite(record["time"], lineno, "time")
        except StepLogError:
            raise
        except (ValueError, AttributeError, KeyError, TypeError, RecursionError):
            raise StepLogError(f"line {lineno} is {_LINE_SHAPE}") from None
        if not segments:
            raise StepLogError(f"line {lineno} comes before any header line")
        segments[-1][1].append((step, t))
    if not segments:
        raise StepLogError("no header line with the process start time")
    return StepLog(tuple(Segment(start, tuple(boundaries)) for start, boundaries in segments))
