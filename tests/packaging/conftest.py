"""A real tiny run (trained once per session with the runtime trainer) for the packaging tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.runtime.test_trainer import TINY, tiny_recipe

__all__ = ["TINY", "edit_summary", "tiny_recipe"]


@pytest.fixture(scope="session")
def tiny_run(sample_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """runs/<name> of a 4-step cpu_smoke-shaped run with a small final evaluation (read-only: copy to edit)."""
    from trnfrontier.runtime.trainer import train

    threads = torch.get_num_threads()
    run = tmp_path_factory.mktemp("packaging") / "tiny"
    recipe = tiny_recipe("budget.max_steps=4")
    try:
        summary = train(recipe, run)
    finally:
        torch.set_num_threads(threads)
    assert summary["status"] == "completed" and summary["val_bpb"] is not None
    (run / "recipe.json").write_text(json.dumps(recipe, indent=2, sort_keys=True))
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
