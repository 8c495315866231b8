"""Filesystem failures (read-only, full, no permission) are one line naming the path."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_run import run_cli
from trnfrontier.runtime.faults import describe, is_user_facing

REPO = Path(__file__).resolve().parents[2]


def test_describe_names_the_path_and_what_to_do() -> None:
    line = describe(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/data/run/x"))
    assert line.startswith("/data/run/x: No space left on device; ") and "free some space" in line
    assert "read-only" in describe(OSError(errno.EROFS, os.strerror(errno.EROFS), "/mnt/ro"))
    assert is_user_facing(OSError(errno.ENOSPC, "No space left on device"))
    assert not is_user_facing(OSError(errno.ECONNRESET, "reset"))  # not a filesystem problem: a bug


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES, errno.EROFS])
def test_a_failing_out_folder_is_one_line_and_leaves_nothing(
    code: int, sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "runs" / "r"
    real_mkdir = Path.mkdir

    def failing_mkdir(self: Path, *args, **kwargs) -> None:
        if self == target:
            raise OSError(code, os.strerror(code), str(self))
        real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", failing_mkdir)
    exit_code, _, err = run_cli(["train", "cpu_smoke", "--out", str(target)], capsys)
    assert exit_code == 1
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"trnf: error: {target}: {os.strerror(code)}; ")
    assert not target.exists()


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) makes the read-only mount")
def test_out_on_a_read_only_file_system(sample_home: Path, tmp_path: Path) -> None:
    read_only = tmp_path / "ro"
    read_only.mkdir()
    probe = subprocess.run(["bwrap", "--dev-bind", "/", "/", "--ro-bind", str(read_only), str(read_only), "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"bwrap cannot mount here: {probe.stderr.decode()[-200:]}")
    result = subprocess.run(
        ["bwrap", "--dev-bind", "/", "/", "--ro-bind", str(read_only), str(read_only),
         sys.executable, "-m", "trnfrontier", "train", "cpu_smoke", "--out", str(read_only / "run")],
        capture_output=True, text=True, cwd=tmp_path, timeout=300, env={**os.environ, "TRNF_PREPARE": str(REPO / "prepare.py")},
    )
    assert result.returncode == 1
    assert result.stderr == f"trnf: error: {read_only / 'run'}: Read-only file system; the file system is read-only; choose a writable location (e.g. --out / -o elsewhere)\n"


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) makes the read-only mount")
@pytest.mark.parametrize("argv", [["recipes", "schema", "-o", "{ro}/schema.json"], ["init", "{ro}/entry"]])
def test_other_outputs_on_a_read_only_file_system(argv: list[str], tmp_path: Path) -> None:
    read_only = tmp_path / "ro"
    read_only.mkdir()
    probe = subprocess.run(["bwrap", "--dev-bind", "/", "/", "--ro-bind", str(read_only), str(read_only), "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"bwrap cannot mount here: {probe.stderr.decode()[-200:]}")
    args = [a.format(ro=read_only) for a in argv]
    result = subprocess.run(
        ["bwrap", "--dev-bind", "/", "/", "--ro-bind", str(read_only), str(read_only), sys.executable, "-m", "trnfrontier", *args],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )
    assert result.returncode != 0 and result.stderr.count("\n") == 1, result.stderr[-2000:]
    assert result.stderr.startswith("trnf: error: ") and args[-1] in result.stderr and "Read-only file system" in result.stderr
    assert not any(read_only.iterdir())


def test_expected_faults_are_one_line_and_bugs_are_not() -> None:
    """The trainer's split: a fault the user can act on ends a run with its one line (the
    traceback only in the run's log); anything else is a bug and keeps its traceback."""
    from trnfrontier.runtime.atomic import DiskFullError
    from trnfrontier.runtime.faults import fault_line
    from trnfrontier.runtime.integrity import DamagedFileError
    from trnfrontier.runtime.runlock import RunLockedError

    full = DiskFullError(Path("/tmp/run/final"), 20_000_000, "the final checkpoint")
    assert fault_line(full) == str(full) and str(full).startswith("disk full writing the final checkpoint /tmp/run/final")
    for code, words in ((errno.EROFS, "read-only"), (errno.EACCES, "permission denied"), (errno.EDQUOT, "quota")):
        line = fault_line(OSError(code, os.strerror(code), "/runs/x/metrics.jsonl"))
        assert line is not None and line.startswith("/runs/x/metrics.jsonl: ") and words in line
    assert fault_line(DamagedFileError(Path("/r/optim.pt"), "its SHA256 differs")) == "/r/optim.pt is damaged (its SHA256 differs)"
    assert fault_line(RunLockedError("runs/x is being written by pid 1")) == "runs/x is being written by pid 1"
    assert "out of memory" in str(fault_line(MemoryError()))
    for bug in (ValueError("shape mismatch"), KeyError("w"), OSError(errno.ECONNRESET, "reset"), RuntimeError("CUDA error")):
        assert fault_line(bug) is None
