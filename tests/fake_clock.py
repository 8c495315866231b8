"""A clock for tests that train in the pytest process: it moves only when it is read.

The trainer charges its budget from a clock; with the wall clock, a test's verdict would
depend on how loaded the machine is and on how long the pytest process has lived (the
organisers' rule charges from when prepare.py was imported). ``FakeClock`` advances a
fixed ``tick`` per read, so a run's charged seconds, stop step and schedule are the same
on any machine.
"""

from __future__ import annotations

import time
from typing import Any


class FakeClock:
    def __init__(self, start: float = 1_000_000.0, tick: float = 0.01) -> None:
        self.now = float(start)
        self.tick = float(tick)

    def __call__(self) -> float:
        self.now += self.tick
        return self.now

    def as_time_module(self) -> Any:
        """A stand-in for the ``time`` module of prepare.py: ``time()`` reads the current
        fake time without advancing it (so the step log records the trainer's boundary
        times exactly); everything else is the real module."""
        clock = self

        class _Time:
            def time(self) -> float:
                return clock.now

            def __getattr__(self, name: str) -> Any:
                return getattr(time, name)

        return _Time()
