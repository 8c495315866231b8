"""Step-time split: data, forward, backward, optimizer, communication, idle.

A phase is timed from its start to the moment the device has finished its work
(``synchronize`` at every boundary, else an asynchronous device would charge the
forward's kernels to whichever phase happened to wait for them). Within each phase the
time until the Python call returned is recorded as ``dispatch``: on an asynchronous
device, a phase whose dispatch is nearly all of its time is host-bound.

``idle`` is the rest of the step: host time between phases (zero_grad, the schedule,
loop overhead) during which the device has nothing queued. ``communication`` is the
gradient all-reduce; a single-process profile has none and says so.

Synchronising at every boundary costs a little overlap, so the split is measured on
instrumented steps interleaved with plain ones, and the report checks that the phases
add up to the plain step time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

PHASES = ("data", "forward", "backward", "optimizer", "communication", "idle")


class PhaseTimer:
    """Times the phases of one step; ``sync`` waits for the device."""

    def __init__(self, sync: Callable[[], None]) -> None:
        self._sync = sync
        self.seconds: dict[str, float] = {}
        self.dispatch: dict[str, float] = {}
        self._step_start = 0.0

    def start_step(self) -> None:
        self._sync()
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.dispatch = dict.fromkeys(PHASES, 0.0)
        self._step_start = time.perf_counter()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        yield
        returned = time.perf_counter()
        self._sync()
        ended = time.perf_counter()
        self.seconds[name] += ended - started
        self.dispatch[name] += returned - started

    def end_step(self) -> dict[str, float]:
        """Phase seconds of the finished step, ``idle`` being the unattributed remainder."""
        self._sync()
        wall = time.perf_counter() - self._step_start
        self.seconds["idle"] = max(0.0, wall - sum(v for k, v in self.seconds.items() if k != "idle"))
        return dict(self.seconds)


def summarize(split_steps: list[dict[str, float]], dispatch_steps: list[dict[str, float]], plain_step_seconds: list[float]) -> dict:
    """Mean seconds and share per phase, and how well the phases add up to the plain step.

    Means, so that the phases add up to the mean instrumented step exactly. The check
    against plain steps compares the fastest instrumented step with the fastest plain
    one: on a shared host, other processes only ever add time, and by tens of percent
    from one step to the next, so the least-disturbed step of each kind is the stable
    estimate of what it costs (as benchmarks take the best of N).
    """
    seconds = {name: statistics.fmean(step[name] for step in split_steps) for name in PHASES}
    dispatch = {name: statistics.fmean(step[name] for step in dispatch_steps) for name in PHASES}
    total = sum(seconds.values())
    fastest_split = min(sum(split.values()) for split in split_steps)
    fastest_plain = min(plain_step_seconds)
    return {
        "phases": {
            name: {"seconds": seconds[name], "share": seconds[name] / total if total else 0.0, "dispatch_seconds": dispatch[name]}
            for name in PHASES
        },
        "phase_sum_seconds": total,
        "step_seconds": statistics.median(plain_step_seconds),
        "step_seconds_mean": statistics.fmean(plain_step_seconds),
        # Fastest instrumented over fastest plain step; > 1: synchronising at every
        # boundary cost overlap the plain step had.
        "phase_sum_over_step": fastest_split / fastest_plain if fastest_plain > 0 else None,
    }
