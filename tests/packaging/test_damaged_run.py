"""A damaged run directory through the real commands: `trnf eval`, `trnf package` and
`trnf train --resume` each refuse with one line naming the file, never a changed score."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_run import run_cli
from tests.runtime.test_checkpoint import save_step, trained
from tests.runtime.test_checkpoint_integrity import flip_byte
from trnfrontier.runtime.rundir import FINAL_DIR, KIT_FILE, MODEL_FILE, OPTIM_FILE, SUMMARY_FILE


@pytest.mark.parametrize("name", [MODEL_FILE, KIT_FILE])
def test_eval_and_package_refuse_a_flipped_byte(run_copy: Path, name: str, tmp_path: Path, capsys) -> None:
    damaged = run_copy / FINAL_DIR / name
    flip_byte(damaged, 0.9)
    target = run_copy if name == MODEL_FILE else damaged
    code, out, err = run_cli(["eval", str(target), "--tokens", "4096", "--json"], capsys)
    assert code != 0 and "Traceback" not in err
    assert str(damaged) in err + out and "SHA256" in err + out
    code, out, err = run_cli(["package", str(run_copy), "-o", str(tmp_path / "s.tar")], capsys)
    assert code != 0 and "Traceback" not in err
    assert err.count("trnf: error:") == 1 and str(damaged) in err.strip().splitlines()[-1]
    assert not (tmp_path / "s.tar").exists()


def test_resume_from_a_damaged_checkpoint_is_refused(run_copy: Path, capsys) -> None:
    (run_copy / SUMMARY_FILE).unlink()  # as a run killed mid-way leaves it
    model, opts = trained()
    save_step(run_copy, 1, model, opts)
    latest = save_step(run_copy, 2, model, opts)
    flip_byte(latest / OPTIM_FILE)
    code, out, err = run_cli(["train", "--resume", str(run_copy)], capsys)
    assert code != 0 and "Traceback" not in err and err.count("trnf: error:") == 1
    assert str(latest / OPTIM_FILE) in err and "step_000001" in err
    assert json.loads((run_copy / "recipe.json").read_text())  # nothing else touched
