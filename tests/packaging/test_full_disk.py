"""A full disk under `trnf package` and `trnf verify`: one line saying how much space is
needed, nothing half-written, and verify never calls a valid archive corrupt because its
own temporary disk filled up. On a real small tmpfs where mounting is permitted (root with
mount namespaces), and with ENOSPC injected into the write everywhere."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.cli_run import run_cli
from tests.tmpfs import small_tmpfs, tmpfs_or_skip
from trnfrontier.verify import archive as verify_archive

REPO = Path(__file__).resolve().parents[2]


def _enospc(*args: object, **kwargs: object) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def _one_error_line(err: str) -> str:
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("trnf: error:")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture(scope="module")
def archive(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("full_disk") / "submission.tar"
    # --force: whether the runtime passes the static screen is another test's business.
    done = subprocess.run(
        [sys.executable, "-m", "trnfrontier", "package", str(tiny_run), "-o", str(out), "--force"],
        capture_output=True, text=True, timeout=600, cwd=REPO,
    )
    assert done.returncode == 0 and out.is_file(), done.stderr[-2000:]
    return out


def test_package_onto_a_full_disk_is_one_line(run_copy: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(tarfile.TarFile, "addfile", _enospc)
    out = tmp_path / "out" / "submission.tar"
    out.parent.mkdir()
    code, _, err = run_cli(["package", str(run_copy), "-o", str(out), "--force"], capsys)
    line = _one_error_line(err)
    assert code != 0 and "disk full writing the archive" in line and "needs about" in line
    assert list(out.parent.iterdir()) == []  # no archive, no .partial


def test_verify_with_a_full_temp_disk_does_not_call_the_archive_corrupt(
    archive: Path, capsys, monkeypatch
) -> None:
    monkeypatch.setattr(verify_archive, "_write_member", _enospc)
    code, out, err = run_cli(["verify", str(archive)], capsys)
    line = _one_error_line(err)
    assert code != 0 and "disk full writing verify's copy of the archive" in line and "TMPDIR" in line
    assert "corrupt" not in err + out


def test_package_onto_a_real_full_tmpfs(run_copy: Path, tmp_path: Path) -> None:
    mount = tmp_path / "small"
    mount.mkdir()
    tmpfs_or_skip(mount)
    command = [sys.executable, "-m", "trnfrontier", "package", str(run_copy), "-o", str(mount / "s.tar"), "--force"]
    done = subprocess.run(small_tmpfs(mount, "256k", command), capture_output=True, text=True, timeout=600, cwd=REPO)
    line = _one_error_line(done.stderr)
    assert done.returncode not in (0, 99) and "disk full writing the archive" in line, done.stderr
    assert done.stdout.strip() == ""  # the tmpfs is empty: nothing half-written


def test_verify_with_a_real_full_temp_tmpfs(archive: Path, tmp_path: Path) -> None:
    mount = tmp_path / "small_tmp"
    mount.mkdir()
    tmpfs_or_skip(mount)
    command = [sys.executable, "-m", "trnfrontier", "verify", str(archive)]
    env = {**os.environ, "TMPDIR": str(mount)}
    done = subprocess.run(small_tmpfs(mount, "256k", command), capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    line = _one_error_line(done.stderr)
    assert done.returncode not in (0, 99) and "disk full writing verify's copy" in line, done.stderr
    assert "corrupt" not in done.stderr


def test_package_onto_a_read_only_folder_names_the_archive(run_copy: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    """The archive is written beside its target under a temporary name; the error names the
    file the user asked for (-o), not that temporary one."""
    out = tmp_path / "out" / "submission.tar"
    out.parent.mkdir()
    real_open = tarfile.open

    def read_only_open(name: object = None, *args: object, **kwargs: object) -> tarfile.TarFile:
        if name is not None and Path(str(name)).parent == out.parent:
            raise OSError(errno.EROFS, "Read-only file system", str(name))
        return real_open(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(tarfile, "open", read_only_open)
    code, _, err = run_cli(["package", str(run_copy), "-o", str(out), "--force"], capsys)
    line = _one_error_line(err)
    assert code != 0 and line.startswith(f"trnf: error: {out}: Read-only file system"), line
    assert list(out.parent.iterdir()) == []
