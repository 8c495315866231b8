"""Progress for long work: what is being done, how far along, and an estimate of the rest.

``steps(description, total)`` is a context manager giving an object with ``advance()``
and ``describe()``; on a terminal it draws a rich progress bar on stderr (so `--json`
stdout stays clean) and removes it when done; elsewhere (CI, a pipe) it prints the
description and each new description as a plain line, so a log still says what the
minutes were spent on.
``Steps.none()`` is the stand-in when the caller shows nothing.
``FileSteps`` is the progress of a child process (the ``trnf eval`` worker): each call one
JSON line in a file, which the parent's ``relay`` replays onto its own bar.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

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


class FileSteps(Steps):
    """Progress written for another process: one JSON line per call, appended to ``path``;
    every advance multiplied by ``scale`` (a rank that sees 1/W of the work reports W x)."""

    def __init__(self, path: str | Path, scale: float = 1.0) -> None:
        super().__init__()
        self._path, self._scale = Path(path), scale

    def _write(self, event: dict[str, object]) -> None:
        with open(self._path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(event) + "\n")

    def advance(self, amount: float = 1.0) -> None:
        self.done += amount * self._scale
        self._write({"advance": amount * self._scale})

    def describe(self, description: str) -> None:
        self._write({"describe": description})


def relay(path: Path, bar: Steps) -> Callable[[], None]:
    """A poll function: replays onto ``bar`` the lines a ``FileSteps`` appended to ``path``
    since the last call (a partly written last line waits for the next call)."""
    offset = 0

    def poll() -> None:
        nonlocal offset
        try:
            with open(path, "rb") as handle:
                handle.seek(offset)
                data = handle.read()
        except FileNotFoundError:
            return
        complete = data[: data.rfind(b"\n") + 1]
        offset += len(complete)
        for line in complete.decode("utf-8", "replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if "advance" in event:
                bar.advance(float(event["advance"]))
            elif "describe" in event:
                bar.describe(str(event["describe"]))

    return poll


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
