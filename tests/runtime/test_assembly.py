"""runtime/assembly.py: the one builder of a training step, for trainer, profiler and benchmark."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
from typing import Any

import pytest
import torch

from trnfrontier.recipes.loading import validate_recipe
from trnfrontier.runtime import assembly, compiling, devices, distributed, muon, optim
from trnfrontier.runtime.recipe import RecipeError, ResolvedRecipe
from trnfrontier.runtime.schedule import lr_multiplier, step_warmup

torch.set_num_threads(1)

ONE_PROCESS = distributed.DistInfo(False, 0, 0, 1)
TINY = {
    "model": {"depth": 2, "n_embd": 64, "head_dim": 16, "vocab_size": 512, "sequence_len": 32},
    "data": {"batch_size": 4, "total_batch_tokens": 512},
    "schedule": {"warmup_steps": 4},
    "runtime": {"device": "cpu", "dtype": "float32", "compile": False, "nproc": 2},
}


def recipe(**sections: Any) -> Any:
    data = {"name": "tiny", **{k: dict(v) for k, v in TINY.items()}}
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return validate_recipe(data, "tiny")


def parts_of(resolved: ResolvedRecipe, world_size: int | None = None) -> assembly.Parts:
    return assembly.build_parts(resolved, devices.resolve(resolved.runtime), ONE_PROCESS, world_size=world_size)


def test_a_steps_tokens_are_cut_over_ranks_and_micro_batches() -> None:
    r = recipe().resolved()
    one, two = assembly.batch_geometry(r, 1), assembly.batch_geometry(r, 2)
    assert (one.accum, one.rank_tokens, one.tokens) == (4, 512, 512)
    assert (two.accum, two.rank_tokens, two.tokens) == (2, 256, 512)
    with pytest.raises(RecipeError, match="total_batch_tokens=512 is not a multiple"):
        assembly.batch_geometry(r, 3)


def test_the_lrs_follow_the_whole_runs_batch_whatever_this_process_does() -> None:
    r = recipe(optim={"reference_batch_tokens": 128}).resolved()
    parts = parts_of(r, world_size=2)  # one rank of two, as the profiler builds it
    scale = math.sqrt(512 / 128)
    assert parts.geometry.accum == 2 and parts.matrix_lr == pytest.approx(r.optim.matrix_lr * scale)
    (matrix,) = [g for o in parts.optimizers for g in o.param_groups if g["name"] == "matrix"]
    assert matrix["initial_lr"] == pytest.approx(r.optim.matrix_lr * scale)


def test_the_same_seed_builds_the_same_weights_and_another_seed_does_not() -> None:
    a = parts_of(recipe().resolved()).model.state_dict()
    b = parts_of(recipe().resolved()).model.state_dict()
    c = parts_of(recipe(runtime={"seed": 7}).resolved()).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_schedule_sets_every_lr_and_muons_momentum_for_the_step() -> None:
    r = recipe().resolved()
    parts = parts_of(r)
    lrm = parts.schedule(1, 0.9)  # step warm-up (2/4) and warm-down (at 0.9) both apply
    want = min(lr_multiplier(0.9, r.schedule.warmup_frac, r.schedule.warmdown_frac, r.schedule.final_lr_frac), step_warmup(1, 4))
    assert lrm == pytest.approx(want) and lrm < 1.0
    for opt in parts.optimizers:
        for group in opt.param_groups:
            assert float(group["lr"]) == pytest.approx(group["initial_lr"] * lrm)
    (muon_opt,) = [o for o in parts.optimizers if isinstance(o, muon.Muon)]
    momentum = muon_opt.param_groups[0]["momentum"].item()
    assert r.optim.muon_momentum_warmup_start < momentum < r.optim.muon_momentum  # warming up


def test_build_step_compiles_what_the_recipe_says(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("TRNF_HOME", str(tmp_path))
    for name in compiling.CACHE_ENVS:
        monkeypatch.delenv(name, raising=False)
    eager = assembly.build_step(parts_of(recipe().resolved()))
    assert not eager.compiled and eager.sharded is None
    assert all(o.update_fn in (optim.adamw_update, muon.muon_update) for o in eager.stepper.optimizers)
    compiled = assembly.build_step(parts_of(recipe(runtime={"compile": True}).resolved()))
    assert compiled.compiled
    assert all(o.update_fn not in (optim.adamw_update, muon.muon_update) for o in compiled.stepper.optimizers)
    assert str(tmp_path) in os.environ["TORCHINDUCTOR_CACHE_DIR"]  # the cache under the data home


_FRESH_BUILD = """
import json, os, sys
from trnfrontier.recipes.loading import validate_recipe
from trnfrontier.runtime import assembly, devices, distributed
r = validate_recipe(json.loads(sys.argv[1]), "tiny").resolved()
assembly.build_step(assembly.build_parts(r, devices.resolve(r.runtime), distributed.DistInfo(False, 0, 0, 1)))
print(os.environ["TORCHINDUCTOR_CACHE_DIR"])
"""


def test_a_fresh_process_compiles_into_the_data_homes_cache(tmp_path) -> None:
    # In a new process, building the model imports torch._dynamo, which sets the variable to
    # torch's /tmp default: the data home's cache must be named before that (as trnf train runs).
    data = {"name": "tiny", **TINY, "runtime": {**TINY["runtime"], "compile": True, "nproc": 1}}
    env = {k: v for k, v in os.environ.items() if k not in compiling.CACHE_ENVS}
    env["TRNF_HOME"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", _FRESH_BUILD, json.dumps(data)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "compile" / "inductor")


def test_a_built_step_trains() -> None:
    r = recipe().resolved()
    parts = parts_of(r, world_size=1)
    step = assembly.build_step(parts).stepper
    x = torch.randint(0, 512, (4, 33), generator=torch.Generator().manual_seed(0))
    losses = [step.take(lambda micro: (x[:, :-1], x[:, 1:], None)).loss for _ in range(8)]
    assert losses[-1] < losses[0]


def test_kernels_are_the_recipes_choice() -> None:
    from trnfrontier.runtime.kernels import (
        KernelFallbackWarning,
        KernelUnavailableError,
        reset_kernels,
    )

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            parts = parts_of(recipe(kernels={"relu2": "auto"}).resolved())
        assert parts.kernels["relu2"] == "reference"  # no NKI on a CPU: said once
        assert any(issubclass(w.category, KernelFallbackWarning) for w in caught)
        with pytest.raises(KernelUnavailableError, match="kernels.relu2: on"):
            parts_of(recipe(kernels={"relu2": "on"}).resolved())
    finally:
        reset_kernels()
