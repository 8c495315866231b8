"""The `trnf` entry point: version, global options, and one-line errors with exit codes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_run import run_cli
from trnfrontier import __version__


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["--version"], capsys)
    assert code == 0
    assert out.strip() == f"trnf {__version__}"


def test_every_command_is_registered(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["--help"], capsys)
    assert code == 0
    for command in ("prepare", "train", "eval", "profile", "package", "verify", "recipes"):
        assert command in out


@pytest.mark.parametrize("argv", [["--help"], ["runs", "--help"], ["compare", "--help"]])
def test_help_paragraphs_flow(argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A docstring's source line breaks do not survive into the help: on a terminal wide enough,
    each command's summary (and each paragraph) is one line, not ragged at the source's wrap."""
    import typer.main

    from trnfrontier.cli.app import app

    monkeypatch.setenv("COLUMNS", "1000")
    code, out, _ = run_cli(argv, capsys)
    assert code == 0
    command = typer.main.get_command(app)
    for name in argv[:-1]:
        command = command.commands[name]  # type: ignore[attr-defined]
    subcommands = getattr(command, "commands", {}).values()
    # A group's help lists each subcommand's first paragraph; a command's shows all of its own.
    shown = [sub.help.split("\n\n")[0] for sub in subcommands] or command.help.split("\n\n")
    paragraphs = [p for p in shown if "\n" in p.strip()]
    assert paragraphs, "no wrapped docstring left to check"
    for paragraph in paragraphs:
        flowed = " ".join(paragraph.split())
        assert any(flowed in line for line in out.splitlines()), (flowed, out)


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["no-such-command"], capsys)
    assert code == 2
    assert "no-such-command" in err


def test_missing_prepare_path_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRNF_PREPARE", raising=False)
    missing = tmp_path / "nope.py"
    code, out, err = run_cli(["--prepare", str(missing), "recipes", "list"], capsys)
    assert code == 2
    assert err.count("\n") == 1 and "nope.py" in err and "Traceback" not in err


def test_console_script_runs_as_a_process() -> None:
    env = dict(os.environ)
    result = subprocess.run([sys.executable, "-m", "trnfrontier", "--version"], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0
    assert result.stdout.strip() == f"trnf {__version__}"
