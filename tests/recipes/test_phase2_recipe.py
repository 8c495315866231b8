"""recipes/phase2_d22.yaml: the sizing its header states is what trnf computes."""

from __future__ import annotations

import torch

from trnfrontier.contract.launch import launch_line, parse_launch
from trnfrontier.contract.phases import PHASES
from trnfrontier.recipes.loading import load_recipe
from trnfrontier.runtime.devices import TRN2_CHIP_PEAK_FLOPS
from trnfrontier.runtime.model import GPT, GPTConfig

MFU = 0.30  # the planning figure the recipe states


def test_phase2_recipe_is_compute_optimal_for_16_chips_and_4_hours() -> None:
    recipe = load_recipe("phase2_d22")
    two = PHASES[2]
    assert recipe.phase == 2 and recipe.budget.seconds == two.budget_seconds
    with torch.device("meta"):
        model = GPT(GPTConfig.from_recipe(recipe.resolved().model))
    params = model.num_params()
    flops = two.chips * TRN2_CHIP_PEAK_FLOPS * MFU * two.budget_seconds
    tokens = flops / model.flops_per_token(recipe.model.sequence_len)
    assert round(params / 1e6) == 546
    assert round(flops / 1e19, 1) == 4.6 and round(tokens / 1e9, 1) == 11.6
    assert 18 <= tokens / params <= 24  # Chinchilla's ~20 tokens per parameter


def test_phase2_recipe_runs_at_both_whole_server_shapes() -> None:
    recipe = load_recipe("phase2_d22")
    parse_launch(launch_line(recipe.runtime.nproc, recipe.runtime.lnc), PHASES[2])
    for shape in PHASES[2].launch_shapes:  # the batch divides at 64 and at 128 ranks
        assert recipe.resolved().grad_accum_steps(shape.nproc) >= 1
    assert recipe.run.checkpoint_every_seconds and recipe.run.checkpoint_every_seconds <= 1800
