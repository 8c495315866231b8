"""kit/out_dir.py: the folder a kit run's train.py is told to write into, and where its
checkpoint is found (no launch: these run in the quick suite)."""

from __future__ import annotations

import os
from pathlib import Path

from trnfrontier.kit import out_dir
from trnfrontier.kit.out_dir import BY_TRNF, OutDir

ENV = "NEURON_COMPETITION_R1_OUT_DIR"


def _pt(path: Path, mtime: float = 2000.0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    os.utime(path, (mtime, mtime))
    return path


def test_trnf_chooses_the_run_directory_unless_the_user_did(tmp_path: Path) -> None:
    run_dir, script_dir = tmp_path / "runs" / "r1", tmp_path / "team"
    ours = out_dir.choose({}, [], run_dir, script_dir)
    assert ours == OutDir(run_dir / "out", BY_TRNF) and ours.env() == {ENV: str(run_dir / "out")}
    assert out_dir.choose({ENV: ""}, [], run_dir, script_dir).chosen_by == BY_TRNF  # set but empty: not a choice
    # The user's variable, relative to the script's folder (its working directory); trnf sets nothing.
    theirs = out_dir.choose({ENV: "mine"}, [], run_dir, script_dir)
    assert theirs == OutDir(script_dir / "mine", ENV) and theirs.env() == {}
    # --out-dir among the script's arguments beats the variable; the last one wins, as in argparse.
    flagged = out_dir.choose({ENV: "mine"}, ["--out-dir", "/a", "--lr", "1", "--out-dir=/b"], run_dir, script_dir)
    assert flagged == OutDir(Path("/b"), "--out-dir") and flagged.env() == {}
    assert out_dir.flag_value(["--out-dir"]) is None and out_dir.flag_value(["--out-directory", "x"]) is None


def test_the_checkpoint_in_the_runs_own_folder_is_found_and_not_flagged(tmp_path: Path) -> None:
    run_dir, script_dir = tmp_path / "team" / "r1", tmp_path / "team"  # a run directory beside the script
    _pt(script_dir / "out" / "final.pt", 500.0)  # a previous run's, beside the script
    written = _pt(run_dir / "out" / "final.pt")
    _pt(run_dir / "out" / "later.pt", 3000.0)  # final.pt wins over a newer file
    found = out_dir.find(out_dir.choose({}, [], run_dir, script_dir), script_dir, run_dir, since=1000.0)
    assert found == out_dir.Found(written, ignored=False)


def test_a_script_that_ignores_the_variable_is_found_beside_itself_and_flagged(tmp_path: Path) -> None:
    run_dir, script_dir = tmp_path / "runs" / "r1", tmp_path / "team"
    beside = _pt(script_dir / "out" / "final.pt")
    chosen = out_dir.choose({}, [], run_dir, script_dir)
    found = out_dir.find(chosen, script_dir, run_dir, since=1000.0)
    assert found == out_dir.Found(beside, ignored=True)
    assert chosen.record(found) == {"out_dir": str(run_dir / "out"), "out_dir_chosen_by": BY_TRNF, "out_dir_ignored": True}
    # The user chose the folder and the script wrote elsewhere: found, and not trnf's knob ignored.
    found = out_dir.find(out_dir.choose({ENV: "mine"}, [], run_dir, script_dir), script_dir, run_dir, since=1000.0)
    assert found == out_dir.Found(beside, ignored=False)
    # Nothing written since the run began: nothing found.
    assert out_dir.find(chosen, script_dir, run_dir, since=3000.0) == out_dir.Found(None, ignored=False)


def test_another_runs_output_beside_the_script_is_never_taken(tmp_path: Path) -> None:
    """A run directory under the script's folder holds that run's checkpoint now: a run whose
    script wrote nothing must not take it (two runs of one script at once)."""
    script_dir = tmp_path / "team"
    other = script_dir / "r2"
    (other).mkdir(parents=True)
    (other / "launch.json").write_text("{}")
    _pt(other / "out" / "final.pt")
    run_dir = script_dir / "r1"
    assert out_dir.another_runs_output(other / "out" / "final.pt")
    assert not out_dir.another_runs_output(script_dir / "out" / "final.pt")
    assert out_dir.find(out_dir.choose({}, [], run_dir, script_dir), script_dir, run_dir, since=1000.0).checkpoint is None
