"""The write-up `trnf train` leaves in a finished run directory: its launch line follows the
recipe's phase and runtime, and a recipe this trnf cannot read is one clear line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trnfrontier.contract.launch import launch_line
from trnfrontier.errors import TrnfError
from trnfrontier.packaging.run_report import write_run_report


def _edit_recipe(run: Path, **changes: object) -> None:
    path = run / "recipe.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_a_phase_2_run_writes_up_its_server_launch(run_copy: Path) -> None:
    recipe = json.loads((run_copy / "recipe.json").read_text())
    _edit_recipe(run_copy, phase=2, runtime={**recipe["runtime"], "nproc": 64, "lnc": 2})
    write_run_report(run_copy)
    assert launch_line(64, 2) in (run_copy / "WRITEUP.md").read_text()


def test_a_recipe_this_trnf_cannot_read_is_one_line(run_copy: Path) -> None:
    _edit_recipe(run_copy, runtime={"nproc": 1})
    with pytest.raises(TrnfError, match=r"run: its recipe is not one this trnf .* can train \(.*runtime\.\w+ is missing"):
        write_run_report(run_copy)
