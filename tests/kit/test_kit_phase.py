"""`trnf train --train-py --phase 1|2`: launch shapes, notes, budget and the phase a kit run
records, which `trnf package` of the run follows.

Everything before launch is tested here; the one short Phase 2 run (its budget held to
14,400 s, then packaged and verified) is in test_kit_package.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kit_fixtures import run_cli, write_train_py

from trnfrontier.contract.launch import launch_line
from trnfrontier.contract.phases import PHASES
from trnfrontier.errors import UsageError
from trnfrontier.kit.harness import DRY_RUN_MAX_RANKS, dry_run_ranks
from trnfrontier.kit.train_kit import KitOptions, phase_notes, rerun_command, validate_shape
from trnfrontier.packaging.kit import run_phase

PHASE_1_NOTE = "--nproc {n} is not a valid submission launch (nproc_per_node is 1, 4 or 8); fine for a local run"
PHASE_2_SHAPES = "Phase 2 runs --nproc_per_node=64 with LNC 2 or --nproc_per_node=128 with LNC 1"


def _errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("trnf: error:")]


# ---------------------------------------------------------------------------- shapes and notes


@pytest.mark.parametrize(("nproc", "lnc"), [(64, 2), (128, 1)])
def test_a_phase_2_shape_is_fine_under_phase_2_and_noted_under_phase_1(nproc: int, lnc: int) -> None:
    assert validate_shape(nproc, lnc, PHASES[2]) == []
    # Phase 1's note is the one it always was, naming Phase 1's choices.
    assert validate_shape(nproc, lnc) == validate_shape(nproc, lnc, PHASES[1]) == [PHASE_1_NOTE.format(n=nproc)]


@pytest.mark.parametrize(("nproc", "lnc"), [(1, 2), (4, 2), (8, 1), (64, 1), (128, 2)])
def test_any_other_shape_under_phase_2_is_noted_with_phase_2s_shapes(nproc: int, lnc: int) -> None:
    [note] = validate_shape(nproc, lnc, PHASES[2])
    assert note.startswith(f"--nproc {nproc} with --lnc {lnc} is not a valid Phase 2 launch")
    assert PHASE_2_SHAPES in note and note.endswith("fine for a local run")


def test_impossible_shapes_stay_usage_errors_in_every_phase() -> None:
    for phase in PHASES.values():
        with pytest.raises(UsageError, match="NEURON_LOGICAL_NC_CONFIG is 1 or 2"):
            validate_shape(64, 3, phase)
        with pytest.raises(UsageError, match="at least one process"):
            validate_shape(0, 2, phase)


def test_phase_2_without_inference_py_is_noted_with_the_command_that_writes_one(tmp_path: Path) -> None:
    train_py = write_train_py(tmp_path, "good")
    [note] = phase_notes(train_py, 64, 2, PHASES[2])
    assert f"{tmp_path / 'inference.py'} does not exist yet" in note and f"`trnf init {tmp_path} --inference-only`" in note
    assert phase_notes(train_py, 4, 2, PHASES[1]) == []  # Phase 1 carries none
    (tmp_path / "inference.py").write_text("# the team's\n")
    assert phase_notes(train_py, 64, 2, PHASES[2]) == []


def test_the_rerun_line_keeps_the_phase(tmp_path: Path) -> None:
    one = rerun_command(KitOptions(tmp_path / "train.py", 64, 2), tmp_path / "run")
    two = rerun_command(KitOptions(tmp_path / "train.py", 64, 2, phase=2), tmp_path / "run")
    assert "--phase" not in one and two == f"{one} --phase 2"


def test_phase_2_dry_runs_stand_in_a_few_ranks_for_the_server() -> None:
    assert dry_run_ranks(8, PHASES[1]) == 8  # Phase 1 as ever: the launch's own count
    assert dry_run_ranks(64, PHASES[2]) == dry_run_ranks(128, PHASES[2]) == DRY_RUN_MAX_RANKS
    assert dry_run_ranks(2, PHASES[2]) == 2


# ---------------------------------------------------------------------------- the command line


def test_phase_is_for_train_py_runs(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["train", "baseline_d10", "--phase", "2"], capsys)
    assert code == 2 and "--phase applies to --train-py runs" in err and "phase=2" in err


@pytest.mark.parametrize("nproc", ["4", "64"])
def test_a_phase_2_dry_run_checks_phase_2s_shapes(nproc: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train_py = tmp_path / "train.py"
    train_py.write_text("print('no loader')\n")  # fails its source stage: nothing launches
    code, _, err = run_cli(["train", "--train-py", str(train_py), "--dry-run", "--phase", "2", "--nproc", nproc], capsys)
    assert code == 1 and "dry run failed at source" in err
    assert ("not a valid Phase 2 launch" in err) == (nproc == "4")
    assert "does not exist yet" in err  # no inference.py beside it
    assert (f"the dry run runs train.py on {DRY_RUN_MAX_RANKS} rank(s)" in err) == (nproc == "64")
    code, _, err = run_cli(["train", "--train-py", str(train_py), "--dry-run", "--nproc", nproc], capsys)
    assert code == 1 and "note:" not in err  # Phase 1's dry run is what it was


# ---------------------------------------------------------------------------- package follows the run


def _kit_run_dir(root: Path, summary: dict[str, object], nproc: int = 1) -> Path:
    run_dir = root / "run"
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps({"final_checkpoint": str(root / "out" / "final.pt"), **summary}))
    (run_dir / "launch.txt").write_text(launch_line(nproc, 2) + "\n")
    return run_dir


def test_the_phase_to_package_is_the_recorded_one_unless_contradicted(tmp_path: Path) -> None:
    two = _kit_run_dir(tmp_path / "two", {"phase": 2})
    older = _kit_run_dir(tmp_path / "older", {})  # a kit run from before phases were recorded
    assert run_phase(two, None) == run_phase(two, 2) == 2
    assert run_phase(older, None) == 1 and run_phase(older, 2) == 2 and run_phase(None, None) == 1
    with pytest.raises(UsageError, match=r"--phase 1: the run in .* was trained as Phase 2"):
        run_phase(two, 1)
    recipe_run = tmp_path / "recipe"
    recipe_run.mkdir()
    (recipe_run / "recipe.json").write_text(json.dumps({"name": "r"}))  # Phase 1 is not written there
    assert run_phase(recipe_run, None) == 1
    with pytest.raises(UsageError, match="trained as Phase 1"):
        run_phase(recipe_run, 2)


def test_package_of_a_phase_2_kit_run_holds_it_to_phase_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train_py = write_train_py(tmp_path / "team", "good")
    run_dir = _kit_run_dir(tmp_path, {"phase": 2}, nproc=4)
    base = ["package", "--train-py", str(train_py), "--run-dir", str(run_dir), "-o", str(tmp_path / "s.tar")]
    code, _, err = run_cli(base, capsys)  # the rehearsal's launch.txt is not a Phase 2 launch
    [line] = _errors(err)
    assert code == 2 and "launch.txt records the launch the run rehearsed" in line and PHASE_2_SHAPES.split(" runs ")[1] in line
    code, _, err = run_cli([*base, "--phase", "1"], capsys)
    [line] = _errors(err)
    assert code == 2 and "--phase 1: the run in" in line and "was trained as Phase 2" in line
    code, _, err = run_cli([*base, "--launch", launch_line(64, 2)], capsys)  # on to Phase 2's files
    [line] = _errors(err)
    assert code == 2 and "Phase 2 submissions carry inference.py beside train.py" in line
    assert not (tmp_path / "s.tar").exists()
