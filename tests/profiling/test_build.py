"""measure.build: the profiler's step comes from the trainer's builder (runtime/assembly.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from trnfrontier.errors import TrnfError, UsageError
from trnfrontier.profiling import measure
from trnfrontier.profiling.arguments import check_comparable
from trnfrontier.recipes.loading import validate_recipe
from trnfrontier.runtime import assembly

torch.set_num_threads(1)


def recipe(**sections: Any) -> Any:
    data = {
        "name": "tiny",
        "model": {"depth": 2, "n_embd": 64, "head_dim": 16, "vocab_size": 512, "sequence_len": 32},
        "data": {"batch_size": 4, "total_batch_tokens": 512},
        "runtime": {"device": "cpu", "dtype": "float32", "compile": False, "nproc": 2},
        **sections,
    }
    return validate_recipe(data, "tiny")


def test_the_profiler_builds_through_it_and_says_a_missing_kernel_in_one_line() -> None:
    setup = measure.build(recipe())
    assert isinstance(setup.parts, assembly.Parts) and setup.stepper is setup.built.stepper
    assert (setup.parts.geometry.accum, setup.tokens_per_step) == (2, 256)  # one rank of runtime.nproc=2
    from trnfrontier.runtime.kernels import reset_kernels

    try:
        with pytest.raises(TrnfError, match="kernels.relu2: on"):
            measure.build(recipe(kernels={"relu2": "on"}))
    finally:
        reset_kernels()


def test_compare_refuses_two_recipes_with_different_kernels() -> None:
    check_comparable(recipe(), recipe(runtime={"seed": 1}))
    with pytest.raises(UsageError, match="different kernels"):
        check_comparable(recipe(), recipe(kernels={"relu2": "auto"}))
