"""The trainer with optim.sharded on two gloo ranks: the same run as DDP bit for bit, and
a resume from a checkpoint whose optimizer state was gathered from the shards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.gloo_ranks import torchrun_entry
from tests.runtime.test_trainer import losses, tiny_recipe
from trnfrontier.runtime.safetensors_io import read_safetensors

COMMON = (
    "schedule.mode=steps",
    "schedule.total_steps=6",
    "eval.final=false",
    "data.total_batch_tokens=256",
    "runtime.nproc=2",
    "optim.normuon=true",
    "optim.weight_decay=0.1",
)


def _train(run: Path, *overrides: str, resume: bool = False, recipe_name: str = "recipe.json") -> dict:
    run.mkdir(exist_ok=True)
    recipe = run / recipe_name
    recipe.write_text(json.dumps(tiny_recipe(*COMMON, *overrides)))
    done = torchrun_entry(recipe, run, 2, *(["--resume"] if resume else []))
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads((run / "summary.json").read_text())


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return read_safetensors(run / "final" / "model.safetensors")[0]


def _same_weights(a: Path, b: Path) -> None:
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name


@pytest.mark.slow
def test_sharded_run_equals_ddp_and_resumes_bit_for_bit(sample_home: Path, tmp_path: Path) -> None:
    ddp = _train(tmp_path / "ddp", "optim.sharded=false")
    sharded = _train(tmp_path / "sharded", "optim.sharded=auto")
    assert ddp["sharded_optimizer"] is False and sharded["sharded_optimizer"] is True
    assert losses(tmp_path / "ddp") == losses(tmp_path / "sharded")
    _same_weights(tmp_path / "ddp", tmp_path / "sharded")

    # Stopped after 3 steps with a checkpoint after each of the first two; resumed to 6.
    cut = tmp_path / "resumed"
    _train(cut, "optim.sharded=true", "budget.max_steps=3", "run.checkpoint_every_seconds=0.001")
    assert (cut / "checkpoints" / "step_000002").is_dir()
    resumed = _train(cut, "optim.sharded=true", resume=True, recipe_name="recipe_resume.json")
    assert resumed["resumed_from"].endswith("step_000002") and resumed["steps"] == 6
    assert losses(cut) == losses(tmp_path / "sharded")
    _same_weights(cut, tmp_path / "sharded")


@pytest.mark.slow
def test_a_sharded_run_resumed_at_another_world_size_is_refused(sample_home: Path, tmp_path: Path) -> None:
    """The trainer's own guard (trnf train --resume refuses another --nproc before it starts a
    worker, tests/train/test_plan.py): a sharded run's optimizer state is split by rank."""
    run = tmp_path / "two"
    _train(run, "optim.sharded=true", "budget.max_steps=2", "run.checkpoint_every_seconds=0.001")
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    recipe = run / "recipe_one.json"
    recipe.write_text(json.dumps(tiny_recipe(*COMMON, "optim.sharded=true", "runtime.nproc=1")))
    done = torchrun_entry(recipe, run, 1, "--resume")
    assert done.returncode != 0
    assert "was written by 2 processes; resume with the same --nproc" in done.stderr, done.stderr[-4000:]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before  # nothing trained or written
