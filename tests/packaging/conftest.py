"""A real tiny run (trained once per session with the runtime trainer) for the packaging tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from trnfrontier.recipes.loading import apply_overrides, parse_overrides, read_recipe_file, validate_recipe

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "model.depth=1", "model.n_embd=64", "model.head_dim=32", "model.n_kv_head=1", "model.sequence_len=32",
    "data.batch_size=4", "runtime.threads=1", "runtime.device=cpu", "eval.tokens=2048", "eval.seq_len=32",
    "eval.batch_size=8", "run.log_every_steps=1", "run.checkpoint_every_seconds=null",
    "budget.startup_steps_excluded=2", "budget.max_steps=4",
]


def tiny_recipe(*extra: str) -> dict:
    data = apply_overrides(read_recipe_file(REPO / "recipes" / "cpu_smoke.yaml"), parse_overrides([*TINY, *extra]))
    return validate_recipe(data, "test").model_dump(mode="json")


@pytest.fixture(scope="session")
def tiny_run(sample_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """runs/<name> of a 4-step cpu_smoke-shaped run with a small final evaluation (read-only: copy to edit)."""
    from trnfrontier.runtime.trainer import train

    threads = torch.get_num_threads()
    run = tmp_path_factory.mktemp("packaging") / "tiny"
    recipe = tiny_recipe()
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
