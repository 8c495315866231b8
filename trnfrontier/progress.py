"""Progress for long work: what is being done, how far along, and an estimate of the rest.

``steps(description, total)`` is a context manager giving an object with ``advance()``
and ``describe()``; on a terminal it draws a rich progress bar on stderr (so `--json`
stdout stays clean) and removes it when done; elsewhere (CI, a pipe) it prints the
description and each new description as a plain line, so a log still says what the
minutes were spent on.
``Steps.none()`` is the stand-in when the caller shows nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from trnfrontier.console import err


class Steps:
    """One task's counter; a no-op without a display."""

    def __init__(self, bar: Progress | None = None, task: TaskID | None = None) -> None:
        self._bar, self._task = bar, task
        self.done = 0.0

    @classmethod
    def none(cls) -> Steps:
        return cls()

    def advance(self, amount: float = 1.0) -> None:
        self.done += amount
        if self._bar is not None and self._task is not None:
            self._bar.advance(self._task, amount)

    def describe(self, description: str) -> None:
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, description=description)


class PlainSteps(Steps):
    """Not a terminal: each new description is one line on stderr, no bar."""

    def __init__(self, console: Console) -> None:
        super().__init__()
        self._console = console
        self._last: str | None = None

    def describe(self, description: str) -> None:
        if description != self._last:
            self._console.print(description)
            self._last = description


@contextmanager
def steps(
    description: str, total: float | None, *, enabled: bool = True, announce: bool = True
) -> Iterator[Steps]:
    """A progress bar of ``total`` units (None: unknown, a spinner and the elapsed time).
    ``announce=False``: off a terminal, print nothing until the first ``describe`` (for
    work that may still be refused before it starts)."""
    if not enabled:
        yield Steps.none()
        return
    console = err()
    if not console.is_terminal:
        plain = PlainSteps(console)
        if announce:
            plain.describe(f"{description} ...")
        yield plain
        return
    bar = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    )
    with bar:
        yield Steps(bar, bar.add_task(description, total=total))
