"""The organisers' training clock, replicated, plus the decision of when to stop.

The rule (``prepare.budget_accounting`` computes the same from the step-boundary log;
``budget_rule`` is its copy outside prepare.py):

    startup  = time from process start to the boundary of step ``startup_steps_excluded``
    excluded = min(startup, startup_allowance_cap_seconds)   # excess startup is charged
    charged  = elapsed - excluded

Steps are counted from 1: ``boundary(1)`` is called when the first optimizer step has
finished (after the device synchronised); startup ends at the first boundary whose step is
at least ``startup_steps_excluded``. The run stops while there is still room for one
more of the longest recent steps plus ``checkpoint_reserve_seconds`` (the final checkpoint).
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable

from trnfrontier.runtime.budget_rule import excluded_startup


def process_start_time() -> float | None:
    """When this process started (epoch seconds), from /proc on Linux; None elsewhere.

    The fallback start of the clock when prepare.py records none (its PROCESS_START_TIME
    is preferred: that is what the organisers' accounting measures from)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22 of stat(5), counted after the ")" of the name
        with open("/proc/stat", encoding="ascii") as handle:
            boot = next(int(line.split()[1]) for line in handle if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


class BudgetClock:
    def __init__(
        self,
        budget_seconds: float,
        startup_steps_excluded: int,
        startup_allowance_cap_seconds: float,
        checkpoint_reserve_seconds: float,
        time_fn: Callable[[], float] = time.time,
        on_boundary: Callable[[int], object] | None = None,
        *,
        start_time: float | None = None,
        window: int = 10,
        prior_charged_seconds: float = 0.0,
        prior_excluded_seconds: float = 0.0,
    ) -> None:
        """``start_time``: when the process started (prepare's recorded start when there is
        one; else now). ``prior_*``: what earlier processes of a resumed run were charged and
        excluded; a resumed process may exclude only what is left of the startup cap."""
        self.budget_seconds = float(budget_seconds)
        self.startup_steps_excluded = int(startup_steps_excluded)
        self.cap_seconds = max(
            0.0, float(startup_allowance_cap_seconds) - float(prior_excluded_seconds)
        )
        self.reserve_seconds = float(checkpoint_reserve_seconds)
        self.prior_charged_seconds = float(prior_charged_seconds)
        self.prior_excluded_seconds = float(prior_excluded_seconds)
        self._time = time_fn
        self._on_boundary = on_boundary
        self.start_time = float(start_time) if start_time is not None else time_fn()
        # Startup ends at the first boundary whose step is >= startup_steps_excluded, as in
        # prepare.budget_accounting (so with 0 excluded steps it still ends at step 1).
        self._startup_end: float | None = None
        self._last_boundary: float | None = None
        self._step_started: float | None = None
        self._recent: deque[float] = deque(maxlen=window)
        self._last_duration: float = 0.0

    # -- events ---------------------------------------------------------------------

    def step_started(self) -> None:
        """Mark the start of a step, so that time spent between steps (a periodic eval or
        checkpoint) is charged but does not inflate the step-time estimate."""
        self._step_started = self._time()

    def boundary(self, step: int) -> None:
        """Step ``step`` (counted from 1) has finished and the device is synchronised."""
        now = self._time()
        if self._on_boundary is not None:
            self._on_boundary(step)
        begin = self._step_started
        if begin is None:
            begin = self._last_boundary if self._last_boundary is not None else self.start_time
        duration = max(0.0, now - begin)
        self._last_duration = duration
        in_startup = self._startup_end is None
        if in_startup and step >= self.startup_steps_excluded:
            self._startup_end = now
        elif not in_startup:
            # Startup steps carry compilation; they would overstate a step's cost for ten
            # steps after it, so only steady-state steps feed the stop estimate.
            self._recent.append(duration)
        self._step_started = None
        self._last_boundary = now

    # -- accounting -----------------------------------------------------------------

    @property
    def last_step_seconds(self) -> float:
        """Duration of the most recent step (from step_started(), else the previous boundary)."""
        return self._last_duration

    @property
    def last_boundary_time(self) -> float | None:
        return self._last_boundary

    @property
    def in_startup(self) -> bool:
        return self._startup_end is None

    def startup_seconds(self, now: float | None = None) -> float:
        """Startup so far: up to the startup boundary, or all elapsed time while still in it."""
        if self._startup_end is not None:
            return self._startup_end - self.start_time
        return (self._time() if now is None else now) - self.start_time

    def excluded_seconds(self, now: float | None = None) -> float:
        return excluded_startup(self.startup_seconds(now), self.cap_seconds)

    def charged_seconds(self, now: float | None = None) -> float:
        """Budget used so far (including earlier processes of a resumed run)."""
        now = self._time() if now is None else now
        elapsed = now - self.start_time
        return self.prior_charged_seconds + max(0.0, elapsed - self.excluded_seconds(now))

    def longest_recent_step(self) -> float:
        if self._recent:
            return max(self._recent)
        return self._last_duration

    def next_step_charge(self) -> float:
        """What one more step (as long as the longest recent one) would add to the charged
        time. A startup step is excluded up to what is left of the startup allowance, so
        a long first step (torch.compile) does not stop a short run before its second."""
        estimate = self.longest_recent_step()
        if self.in_startup:
            left = max(0.0, self.cap_seconds - self.startup_seconds())
            return max(0.0, estimate - left)
        return estimate

    def should_stop(self) -> bool:
        """True when one more step plus the checkpoint reserve would cross the budget."""
        return (
            self.charged_seconds() + self.next_step_charge() + self.reserve_seconds
            >= self.budget_seconds
        )

    def progress(self) -> float:
        """Fraction of the usable budget charged so far, in [0, 1], for time-driven schedules.

        The usable budget leaves out the checkpoint reserve: the run stops there, and the
        warmdown must have reached its final LR by then."""
        usable = max(self.budget_seconds - self.reserve_seconds, 1e-9)
        return min(1.0, max(0.0, self.charged_seconds() / usable))

    def summary(self) -> dict[str, float | bool]:
        """The organisers' numbers as of the last step boundary (what the step log shows)."""
        at = self._last_boundary if self._last_boundary is not None else self._time()
        charged = self.charged_seconds(at)
        return {
            "startup_seconds": self.startup_seconds(at),
            "excluded_seconds": self.prior_excluded_seconds + self.excluded_seconds(at),
            "charged_seconds": charged,
            "headroom_seconds": self.budget_seconds - charged,
            "over_budget": charged > self.budget_seconds,
        }
