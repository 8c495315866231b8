"""Recipes as data: pydantic models loaded from YAML, with ``key.path=value`` overrides."""

from trnfrontier.recipes.loading import load_recipe, parse_overrides
from trnfrontier.recipes.schema import Recipe

__all__ = ["Recipe", "load_recipe", "parse_overrides"]
