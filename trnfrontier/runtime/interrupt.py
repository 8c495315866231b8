"""Ctrl-C during training: a checkpoint of the step in progress when there is time.

`trnf train` passes a Ctrl-C (or a SIGTERM to itself) to its trainer as SIGINT (torchrun
hands it on to every rank). While the training loop runs, the first SIGINT only asks for
a stop: the loop finishes the step it is on, every rank agrees at the step's end (the same
all-reduce that carries the other stop decisions), the checkpoint of that step is written
and the run ends as ``interrupted``, so ``--resume`` repeats nothing. A second SIGINT, or
a first one with nothing new to save (no step completed since the last checkpoint),
stops at once (KeyboardInterrupt). Runtime layer: standard library only.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType


class StopRequest:
    """Whether a stop was asked for; called as the SIGINT handler while installed."""

    def __init__(self, unsaved_steps: Callable[[], int] = lambda: 0) -> None:
        self.requested = False
        self.unsaved_steps = unsaved_steps  # steps done since the last checkpoint

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.requested or self.unsaved_steps() <= 0:
            raise KeyboardInterrupt
        self.requested = True
        print(
            "interrupted: finishing this step, then writing its checkpoint (interrupt again to stop at once)",
            file=sys.stderr,
            flush=True,
        )


@contextmanager
def stop_requests(unsaved_steps: Callable[[], int]) -> Iterator[StopRequest]:
    """Within the block, SIGINT asks ``StopRequest`` to stop after the current step (main
    thread only; elsewhere the request is never set and SIGINT behaves as before)."""
    request = StopRequest(unsaved_steps)
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    previous = signal.signal(signal.SIGINT, request)
    try:
        yield request
    finally:
        signal.signal(signal.SIGINT, previous)
