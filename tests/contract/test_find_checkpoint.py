"""contract/checkpoint.find_checkpoint: the one search for the checkpoint a run wrote, as
kit train (a script's directory, this run's files only) and both dry runs (a fresh copy) use it."""

from __future__ import annotations

import os
from pathlib import Path

from trnfrontier.contract.checkpoint import find_checkpoint


def _pt(root: Path, rel: str, mtime: float) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    os.utime(path, (mtime, mtime))
    return path


def test_the_kits_out_final_pt_wins_over_newer_files(tmp_path: Path) -> None:
    kit = _pt(tmp_path, "out/final.pt", 1000.0)
    _pt(tmp_path, "ckpt/later.pt", 2000.0)
    assert find_checkpoint(tmp_path) == kit
    assert find_checkpoint(tmp_path, since=900.0) == kit


def test_else_the_newest_pt_up_to_three_levels_deep(tmp_path: Path) -> None:
    _pt(tmp_path, "model.pt", 1000.0)
    newest = _pt(tmp_path, "checkpoints/step_10/model.pt", 3000.0)
    _pt(tmp_path, "a/b/c/too_deep.pt", 9000.0)
    assert find_checkpoint(tmp_path) == newest


def test_hidden_folders_are_not_searched(tmp_path: Path) -> None:
    found = _pt(tmp_path, "run/model.pt", 1000.0)
    _pt(tmp_path, ".cache/newer.pt", 5000.0)
    assert find_checkpoint(tmp_path) == found


def test_kit_train_skips_a_previous_runs_files_and_its_own_run_directory(tmp_path: Path) -> None:
    """Kit train searches the script's directory, which may hold an older out/final.pt and
    trnf's run directory (``exclude``); only what this run wrote (``since``) counts."""
    _pt(tmp_path, "out/final.pt", 100.0)  # a previous run's
    _pt(tmp_path, "runs/kit-1/copy.pt", 5000.0)  # inside trnf's run directory
    written = _pt(tmp_path, "ckpt/model.pt", 2000.0)
    assert find_checkpoint(tmp_path, since=1000.0, exclude=tmp_path / "runs" / "kit-1") == written
    assert find_checkpoint(tmp_path, since=3000.0, exclude=tmp_path / "runs" / "kit-1") is None


def test_nothing_written_is_none(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "train.py").write_text("")
    assert find_checkpoint(tmp_path) is None
