"""`trnf verify` at the command line: what it refuses before opening anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.test_app import run_cli


def test_a_missing_archive_or_a_folder_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["verify", str(tmp_path / "missing.tar")], capsys)
    assert code == 2 and out == ""
    assert err.strip() == f"trnf: error: {tmp_path / 'missing.tar'}: no such file; give the path of a submission archive"
    code, out, err = run_cli(["verify", str(tmp_path)], capsys)
    assert code == 2 and out == ""
    assert err.strip() == f"trnf: error: {tmp_path}: is a directory; give the path of a submission archive (trnf package writes one)"
