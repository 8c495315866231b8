"""The one error type the CLI turns into a single clear line and an exit code.

Library code raises ``TrnfError("what is wrong, where; what to do")``; the CLI entry
point prints it as ``trnf: error: ...`` with no traceback. Anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations


class TrnfError(Exception):
    """A failure the user can act on: bad input, missing data, a refused operation."""

    exit_code: int = 1

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(TrnfError):
    """The command line itself is wrong (exit 2, like argparse and Typer)."""

    exit_code = 2
