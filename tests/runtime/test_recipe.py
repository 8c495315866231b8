"""The typed resolved recipe: one definition the schema builds and the runtime reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from trnfrontier.recipes.loading import load_recipe
from trnfrontier.recipes.schema import Recipe
from trnfrontier.runtime.recipe import RecipeError, ResolvedRecipe, grad_accum_steps

SHIPPED = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml"))


@pytest.mark.parametrize("name", SHIPPED)
def test_the_schema_builds_it_and_it_round_trips_to_the_same_data(name: str) -> None:
    recipe = load_recipe(name)
    resolved = recipe.resolved()
    assert resolved.to_dict() == recipe.model_dump(mode="json")
    assert resolved.grad_accum_steps(recipe.runtime.nproc) == recipe.grad_accum_steps()


def test_every_schema_key_has_a_typed_field_and_no_more() -> None:
    schema = Recipe(name="x").model_dump(mode="json")
    typed = ResolvedRecipe.from_dict(schema).to_dict()
    for section, value in schema.items():
        if isinstance(value, dict):
            assert set(typed[section]) == set(value), section
    assert set(typed) == set(schema)


def test_a_missing_or_unknown_key_is_named() -> None:
    data = Recipe(name="x").model_dump(mode="json")
    del data["optim"]["grad_clip"]
    with pytest.raises(RecipeError, match=r"optim\.grad_clip is missing"):
        ResolvedRecipe.from_dict(data)
    data = Recipe(name="x").model_dump(mode="json")
    data["budget"]["secs"] = 1.0
    with pytest.raises(RecipeError, match=r"unknown key budget\.secs"):
        ResolvedRecipe.from_dict(data)


def test_grad_accum_steps_and_its_refusal() -> None:
    assert grad_accum_steps(4, 128, 2, None) == 1
    assert grad_accum_steps(4, 128, 2, 4 * 128 * 2 * 3) == 3
    with pytest.raises(RecipeError, match="total_batch_tokens=1000"):
        grad_accum_steps(4, 128, 2, 1000)
