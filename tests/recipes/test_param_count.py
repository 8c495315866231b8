"""`count_params` (arithmetic, no torch) equals the built model's parameter count."""

from __future__ import annotations

import pytest
import torch

from trnfrontier.recipes.describe import VE_GATE_CHANNELS, count_params
from trnfrontier.recipes.loading import load_recipe
from trnfrontier.runtime import model as model_mod
from trnfrontier.runtime.model import GPT, GPTConfig


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["model.value_embeds=true"],
        ["model.value_embeds=true", "model.depth=3", "model.n_kv_head=1"],
        ["model.n_embd=96", "model.head_dim=16", "model.mlp_ratio=3", "model.value_embeds=true"],
        ["model.depth=4", "model.n_embd=16", "model.head_dim=8", "model.value_embeds=true"],
        ["model.vocab_size=512", "model.depth=5", "model.aspect_ratio=40"],
    ],
)
def test_count_params_matches_the_model(overrides: list[str]) -> None:
    recipe = load_recipe("cpu_smoke", overrides)
    with torch.device("meta"):
        built = GPT(GPTConfig.from_recipe(recipe.resolved().model)).num_params()
    assert count_params(recipe) == built


def test_gate_width_is_the_model_constant() -> None:
    assert VE_GATE_CHANNELS == model_mod.VE_GATE_CHANNELS
