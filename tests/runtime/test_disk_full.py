"""Disk full while the trainer writes (ENOSPC injected into the checkpoint writer): no run
is lost. A periodic checkpoint that does not fit is skipped and the run goes on; a final
checkpoint that does not fit leaves the newest good checkpoint, named in the summary, and
the run resumes from it to the end."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from tests.fake_clock import FakeClock
from tests.runtime.test_trainer import tiny_recipe
from trnfrontier.runtime import atomic
from trnfrontier.runtime.checkpoint_ref import list_checkpoints
from trnfrontier.runtime.integrity import check_directory
from trnfrontier.runtime.rundir import FINAL_DIR, SUMMARY_FILE
from trnfrontier.runtime.trainer import train

RECIPE = ("schedule.mode=steps", "schedule.total_steps=6", "run.checkpoint_every_seconds=0.001", "eval.final=false")


def _full_disk_for(monkeypatch, target_prefix: str, times: int = 10**9) -> list[str]:
    """Make every write into a temporary directory named ``.tmp-<target_prefix>...`` fail
    with ENOSPC (``times`` times); returns the list of refused paths."""
    real = atomic._write_file
    refused: list[str] = []

    def write(path: Path, write_fn) -> None:
        if path.parent.name.startswith(f".tmp-{target_prefix}") and len(refused) < times:
            refused.append(str(path))
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, write_fn)

    monkeypatch.setattr(atomic, "_write_file", write)
    return refused


def test_full_disk_at_the_final_checkpoint_keeps_the_last_good_one(
    sample_home: Path, tmp_path: Path, monkeypatch, capfd
) -> None:
    run = tmp_path / "run"
    refused = _full_disk_for(monkeypatch, FINAL_DIR)
    with pytest.raises(atomic.DiskFullError) as info:
        train(tiny_recipe(*RECIPE), run, time_fn=FakeClock())
    assert len(refused) == 2  # the first try, and the retry after making room
    assert "needs about" in str(info.value) and "MB is free" in str(info.value)
    summary = json.loads((run / SUMMARY_FILE).read_text())
    assert summary["status"] == "crashed" and summary["error"].startswith("disk full writing the final checkpoint")
    assert summary["expected_fault"] is True  # `trnf train` shows its line, not the traceback
    kept = Path(summary["last_good_checkpoint"])
    assert list_checkpoints(run) == [kept] and check_directory(kept)  # intact, the older one made room
    assert not (run / FINAL_DIR).exists()
    assert not [p for p in run.rglob(".tmp-*")]  # nothing half-written left
    assert "removed the older checkpoint" in capfd.readouterr().err

    monkeypatch.undo()  # space freed: resume redoes the end of the run
    resumed = train(tiny_recipe(*RECIPE), run, resume=True, time_fn=FakeClock())
    assert resumed["status"] == "completed" and resumed["steps"] == 6
    assert check_directory(run / FINAL_DIR)


def test_full_disk_at_a_periodic_checkpoint_costs_only_that_checkpoint(
    sample_home: Path, tmp_path: Path, monkeypatch, capfd
) -> None:
    run = tmp_path / "run"
    refused = _full_disk_for(monkeypatch, "step_000003", times=1)
    summary = train(tiny_recipe(*RECIPE), run, time_fn=FakeClock())
    assert refused and summary["status"] == "completed" and summary["steps"] == 6
    assert "checkpoint skipped, last good one" in capfd.readouterr().err
    assert all(check_directory(p) for p in list_checkpoints(run))
    assert check_directory(run / FINAL_DIR)
