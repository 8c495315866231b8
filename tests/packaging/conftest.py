"""A real tiny run (trained once per session with the runtime trainer) for the packaging tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.runtime.test_trainer import TINY, _entry, tiny_recipe

REPO = Path(__file__).resolve().parents[2]

__all__ = ["TINY", "edit_summary", "tiny_recipe"]


@pytest.fixture(scope="session")
def tiny_run(sample_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """runs/<name> of a 4-step cpu_smoke-shaped run with a small final evaluation (read-only: copy to edit).

    Trained by the runtime's entry point in a fresh process, as `trnf train` does: the
    budget clock starts with that process, not with this (possibly long) test session.
    """
    run = tmp_path_factory.mktemp("packaging") / "tiny"
    run.mkdir()
    recipe = tiny_recipe("budget.max_steps=4")
    (run / "recipe.json").write_text(json.dumps(recipe, indent=2, sort_keys=True))
    proc = _entry(run)  # python -m trnfrontier.runtime.entry, as the trainer tests start it
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr.decode()[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert (
        summary["status"] == "completed"
        and summary["val_bpb"] is not None
        and not summary["over_budget"]
    )
    return run


@pytest.fixture()
def run_copy(tiny_run: Path, tmp_path: Path) -> Path:
    """A copy of the tiny run that a test may spoil."""
    target = tmp_path / "run"
    shutil.copytree(tiny_run, target)
    return target


def edit_summary(run: Path, **changes: object) -> None:
    path = run / "summary.json"
    summary = json.loads(path.read_text())
    summary.update(changes)
    path.write_text(json.dumps(summary))
