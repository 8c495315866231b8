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


@pytest.mark.parametrize("content, what", [
    (b"hello\n", "a 6-byte text file starting 'hello'"),
    (b"", "an empty file"),
    (b"PK\x03\x04" + b"\x00" * 60, "a zip archive (64 bytes)"),
    (b"\x1f\x8b\x08\x00" + b"\x00" * 20, "gzip-compressed data that holds no tar archive (24 bytes)"),
    (bytes(range(256)) * 4, "1,024 bytes of binary data"),
    (b"[bold]x[/]\x1b[31m\n", "a 16-byte text file starting '[bold]x[/]\\x1b[31m'"),  # quoted, escaped
])
def test_a_file_that_is_not_an_archive_is_one_line_saying_what_it_is(
    content: bytes, what: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The outside's case: a table of nine skipped checks before "FAIL: extract"."""
    path = tmp_path / "submission.tar"
    path.write_bytes(content)
    code, out, err = run_cli(["verify", str(path)], capsys)
    assert code == 1 and out == ""
    assert err == (
        f"trnf: error: {path} is not a submission archive: it is {what}; trnf verify takes the tar archive "
        "`trnf package` writes (plain, or gzip, bzip2 or xz compressed)\n"
    )
    code, out, _ = run_cli(["verify", str(path), "--json"], capsys)  # a script still gets the whole report
    assert code == 1 and '"extract"' in out
