"""`trnf ARGS` in the test's own process, through the real entry point and its error boundary."""

from __future__ import annotations

import pytest

from trnfrontier.cli.app import main


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `trnf ARGS`."""
    with pytest.raises(SystemExit) as exited:
        main(args)
    captured = capsys.readouterr()
    return int(exited.value.code or 0), captured.out, captured.err
