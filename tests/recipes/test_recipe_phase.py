"""``phase: 1|2`` in a recipe: the phase's budget, its limit, and Phase 1 written as before."""

from __future__ import annotations

import pytest

from trnfrontier.errors import TrnfError
from trnfrontier.recipes.loading import load_recipe, validate_recipe
from trnfrontier.runtime.recipe import RecipeError, ResolvedRecipe


def test_phase_1_is_the_default_and_is_not_written() -> None:
    recipe = load_recipe("baseline_d10")
    assert recipe.phase == 1 and recipe.budget.seconds == 1800
    dumped = recipe.model_dump(mode="json")
    assert "phase" not in dumped  # recipe.json, meta.json and train.py stay as they were
    resolved = ResolvedRecipe.from_dict(dumped)
    assert resolved.phase == 1 and resolved.to_dict() == dumped


def test_phase_2_takes_four_hours_unless_the_recipe_says_otherwise() -> None:
    recipe = validate_recipe({"name": "final", "phase": 2}, "test")
    assert recipe.budget.seconds == 14_400
    dumped = recipe.model_dump(mode="json")
    assert dumped["phase"] == 2 and ResolvedRecipe.from_dict(dumped).to_dict() == dumped
    shorter = validate_recipe({"name": "final", "phase": 2, "budget": {"seconds": 600}}, "test")
    assert shorter.budget.seconds == 600
    # A recipe that names its seconds keeps them whatever the phase.
    assert load_recipe("baseline_d10", ["phase=2"]).budget.seconds == 1800


@pytest.mark.parametrize(("overrides", "limit"), [(["budget.seconds=2400"], "1800"), (["phase=2", "budget.seconds=20000"], "14400")])
def test_each_phase_has_its_competition_limit(overrides: list[str], limit: str) -> None:
    with pytest.raises(TrnfError, match=rf"budget: seconds=\d+ exceeds the competition budget of {limit} s"):
        load_recipe("baseline_d10", overrides)


@pytest.mark.parametrize("bad", ["phase=3", "phase=true", "phase=0"])
def test_a_phase_that_does_not_exist_is_refused(bad: str) -> None:
    with pytest.raises(TrnfError, match="phase"):
        load_recipe("baseline_d10", [bad])


def test_the_runtime_refuses_a_bad_phase_in_recipe_json() -> None:
    dumped = load_recipe("baseline_d10").model_dump(mode="json")
    with pytest.raises(RecipeError, match="phase=3 must be 1 or 2"):
        ResolvedRecipe.from_dict({**dumped, "phase": 3})
