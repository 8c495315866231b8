"""The step log: what ``prepare.record_step_boundary`` appends, read one way only.

Every reader (the budget check, a kit run's per-step charge, the dry runs' count of steps,
verify) goes through ``read_step_log``, so the rules cannot drift apart. How one line is
read is ``steplog_lines`` (the module the organisers' real format would change); this one
turns lines into a run's segments and holds the rules between lines:

- A header starts a segment (one per process: a resumed run has several, and the budget
  of a single run counts the last one). Records before any header belong to a first
  segment that starts at ``launch``, the time the caller launched the process (trnf knows
  it for the runs it starts), named by ``launch_source``; without one, such a log has no
  start and is refused.
- A record's end time is its ``time``, else the segment's start + ``elapsed``, else the
  previous end + ``dt`` (a lower bound: the time between steps is not in any dt). In a
  segment that starts at ``launch``, a ``time`` more than a day before the launch is no
  epoch time but seconds since the process started (a ``perf_counter() - t0``): it is read
  so, and ``describe`` says it was. Such a time that would put a step after the log was
  last written is neither, and refused.
- Times never go backwards: each end is at or after the previous end of its segment and
  its segment's start, and each segment starts at or after the previous one's last end.
  Step indexes increase within a segment (a resumed process may repeat steps done after
  its checkpoint, so a new segment may start lower).

Refused with the line named: a line that is none of the shapes ``steplog_lines`` reads, a
number that is not finite, a time that goes backwards, a log with no record at all.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from trnfrontier.contract.steplog_lines import (
    TEE_PREFIX,
    Header,
    LineError,
    Record,
    When,
    parse_line,
)

Boundary = tuple[int, float]  # (0-based index of the step completed, time in seconds)
HEADER = "the log's header line"
# A "time" this far below the launch is no epoch time (a perf_counter's, since the start).
RELATIVE_BELOW_LAUNCH = 86_400.0
# How far after the log's last write a step may be read to end (clock granularity, slack).
WRITTEN_SLACK = 60.0


class StepLogError(ValueError):
    """The step log cannot be read as one; the message names the line and why."""


@dataclass(frozen=True)
class Segment:
    """One process's part of the log: its start time and the boundaries it recorded, in order."""

    start: float
    boundaries: tuple[Boundary, ...]


@dataclass(frozen=True)
class StepLog:
    """Every segment of a step log, in order (at least one), and how it was read."""

    segments: tuple[Segment, ...]
    start_source: str = HEADER  # where the first segment's start time came from
    when: tuple[When, ...] = ("time",)  # what its records gave: absolute times, elapsed seconds, durations
    text: bool = False  # printed "step N | ..." lines rather than JSON
    prefixed: bool = False  # lines behind torchrun's "[default0]:", copied from a console
    relative: bool = False  # its "time"s were seconds since the start, not since the epoch

    @property
    def last(self) -> Segment:
        """The last process's segment: the one run a budget check of a single run counts."""
        return self.segments[-1]

    @property
    def lower_bound(self) -> bool:
        """Ends summed from step durations (dt): the time between steps is missing."""
        return "dt" in self.when

    def describe(self) -> str:
        """How the log was read, for a summary and the console ("JSON lines {step, time}; start time: ...")."""
        shape = "printed step lines" if self.text else "JSON lines"
        fields = {"time": "time", "elapsed": "elapsed seconds", "dt": "dt"}
        what = f"{shape} (step, {' / '.join(fields[w] for w in self.when)})"
        bound = "; ends summed from dt, a lower bound (the time between steps is not in it)" if self.lower_bound else ""
        prefix = " behind torchrun's [rank]: prefix" if self.prefixed else ""
        relative = (
            "; its times, far below the launch's epoch, read as seconds since the process started" if self.relative else ""
        )
        return f"{what}{prefix}; start time from {self.start_source}{relative}{bound}"


def _numbered_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based number, text) of each line, streamed: a long log is never held whole."""
    with open(path, encoding="utf-8") as handle:
        try:
            yield from enumerate(handle, 1)
        except UnicodeDecodeError:
            raise StepLogError("not UTF-8 text") from None


class _Builder:
    """The segments so far, and the rules between lines."""

    def __init__(self, launch: float | None, launch_source: str) -> None:
        self.launch, self.launch_source = launch, launch_source
        self.segments: list[tuple[float, list[Boundary]]] = []
        self.start_source = HEADER
        self.when: set[When] = set()
        self.text = self.prefixed = self.relative = False

    def _end(self) -> float | None:
        if not self.segments:
            return None
        start, boundaries = self.segments[-1]
        return boundaries[-1][1] if boundaries else start

    def header(self, lineno: int, header: Header) -> None:
        end = self._end()
        if end is not None and header.start < end:
            raise StepLogError(f"line {lineno}: a process starts at {header.start:.3f}, before the previous one's last step ended ({end:.3f})")
        self.segments.append((header.start, []))

    def record(self, lineno: int, record: Record) -> None:
        if not self.segments:
            if self.launch is None:
                raise StepLogError(
                    f"line {lineno} comes before any header line, and nothing else says when the process "
                    "started (a log without a header needs the run's launch time)"
                )
            self.segments.append((self.launch, []))
            self.start_source = self.launch_source
        start, boundaries = self.segments[-1]
        previous = boundaries[-1] if boundaries else None
        if record.when == "time" and self._relative(record.value):
            end = start + record.value
        elif record.when == "time":
            end = record.value
        elif record.when == "elapsed":
            end = start + record.value
        else:
            end = (previous[1] if previous else start) + record.value
        if previous is not None and record.step <= previous[0]:
            raise StepLogError(f"line {lineno}: step index {record.step} after {previous[0]}; indexes increase within a process")
        floor, what = (previous[1], f"step {previous[0]}'s end") if previous else (start, "its process's start")
        if end < floor:
            raise StepLogError(f"line {lineno}: step {record.step} ends at {end:.3f}, before {what} ({floor:.3f}): time goes backwards")
        boundaries.append((record.step, end))
        self.when.add(record.when)
        self.text = self.text or record.printed

    def _relative(self, time: float) -> bool:
        """Whether a record's ``time`` is seconds since its process started: it is in the
        segment that starts at the launch (no header said otherwise) and far below it."""
        relative = len(self.segments) == 1 and self.start_source != HEADER and time < self.segments[0][0] - RELATIVE_BELOW_LAUNCH
        self.relative = self.relative or relative
        return relative

    def written_by(self, written: float) -> None:
        """Refuse times read as since the start that end after the log was last written
        (``written``, its mtime): they were neither (a perf_counter since the machine booted)."""
        end = self._end()
        if self.relative and end is not None and end > written + WRITTEN_SLACK:
            raise StepLogError(
                f"its times are neither seconds since the epoch nor since the process started (the last step would "
                f"end {end - written:.0f} s after the log was written): record time.time() at each step boundary"
            )

    def log(self) -> StepLog:
        if not self.segments:
            raise StepLogError("no header line with the process start time" if self.launch is None else "no step recorded")
        order = [w for w in ("time", "elapsed", "dt") if w in self.when] or ["time"]
        return StepLog(
            tuple(Segment(start, tuple(b)) for start, b in self.segments),
            self.start_source,
            tuple(order),
            self.text,
            self.prefixed,
            self.relative,
        )


def read_step_log(path: Path, launch: float | None = None, launch_source: str = "the run's launch") -> StepLog:
    """The segments of the step log at ``path`` (see the module docstring for the rules);
    OSError when it cannot be opened, StepLogError when it is not a step log.

    ``launch``: when the caller started the process that wrote the log (seconds since the
    epoch), the start of a log that has no header; ``launch_source`` says what it is."""
    built = _Builder(launch, launch_source)
    for lineno, line in _numbered_lines(path):
        try:
            item = parse_line(line)
        except LineError as exc:
            raise StepLogError(f"line {lineno} {exc}") from None
        built.prefixed = built.prefixed or (item is not None and TEE_PREFIX.match(line.strip()) is not None)
        if isinstance(item, Header):
            built.header(lineno, item)
        elif isinstance(item, Record):
            built.record(lineno, item)
    built.written_by(os.stat(path).st_mtime)
    return built.log()
