"""The valid archive passes every check; a pickle payload never runs; a screen failure blocks execution.

Each crafted bad archive of corpus.py (and hostile.py) is run by test_hostile.py."""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path

import pytest
from corpus import CORPUS, MARKER_NAME, _Payload
from verify_kit import build_archive, pins_file

from trnfrontier.verify import Options, verify_archive
from trnfrontier.verify.runner import CHECK_NAMES


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture()
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tmp_path with verify's temporary directories inside it, so escapes are observable."""
    (tmp_path / "tmp").mkdir()
    (tmp_path / "work").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    return tmp_path


def test_valid_archive_passes_every_check(sandbox: Path) -> None:
    archive = build_archive(sandbox / "work")
    report = verify_archive(archive, Options(pins_file=pins_file(sandbox)))
    assert [c.name for c in report.checks] == list(CHECK_NAMES)
    assert [c for c in report.checks if c.verdict != "pass"] == []
    assert report.ok and report.exit_code == 0
    assert _tree(sandbox / "tmp") == set()  # the temporary directory is gone


def test_pickle_payload_is_real_but_never_runs(sandbox: Path) -> None:
    """The payload does create its marker when unpickled unsafely; verify never does that."""
    probe_marker = sandbox / "unsafe" / MARKER_NAME
    probe_marker.parent.mkdir()
    pickle.loads(pickle.dumps(_Payload(probe_marker)))
    assert probe_marker.exists()
    build, _ = CORPUS["pickle-payload"]
    archive = build(sandbox / "work")
    report = verify_archive(archive, Options(pins_file=pins_file(sandbox)))
    assert "weights_only" in report.get("checkpoint").reason
    assert report.get("contract").verdict == "skip"  # archive code never ran
    assert not (sandbox / "work" / MARKER_NAME).exists()


def test_screen_failure_blocks_code_execution(sandbox: Path) -> None:
    build, _ = CORPUS["opens-socket"]
    report = verify_archive(build(sandbox / "work"), Options(pins_file=pins_file(sandbox), rerun_eval=True, dry_run=True))
    for name in ("contract", "rerun-eval", "dry-run"):
        assert report.get(name).verdict == "skip"
        assert "screen" in report.get(name).reason


def test_hostile_member_written_nowhere(sandbox: Path) -> None:
    build, _ = CORPUS["dotdot"]
    archive = build(sandbox / "work")
    cwd = os.getcwd()
    os.chdir(sandbox / "work")
    try:
        verify_archive(archive, Options(pins_file=pins_file(sandbox)))
    finally:
        os.chdir(cwd)
    assert not list(sandbox.rglob("x"))
