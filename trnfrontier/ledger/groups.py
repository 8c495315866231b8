"""What `trnf compare A B` means by A and B: a group of runs from the ledger.

- ``name1,name2,...``: exactly those runs (names or run directories);
- a glob of run names (``lr03-*``): the runs it matches;
- one run (name or directory): every run of the same configuration, that is the same
  resolved recipe apart from name, description and ``runtime.seed``: its seeds;
- a recipe (shipped name or YAML path), optionally followed by overrides in the same
  argument (``"muon_gqa optim.matrix_lr=0.03"``): the runs of that configuration.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trnfrontier.errors import UsageError
from trnfrontier.ledger import reader
from trnfrontier.ledger.record import find_run


@dataclass
class Group:
    """Runs standing for one side of a comparison, and the configuration they share
    (when they share one: needed to train more seeds)."""

    label: str
    runs: list[dict[str, Any]]
    recipe: dict[str, Any] | None = None  # the resolved recipe, seed and name aside
    recipe_ref: str | None = None
    overrides: list[str] = field(default_factory=list)

    @property
    def key(self) -> str | None:
        return reader.recipe_key(self.recipe) if self.recipe is not None else None


def _shared_recipe(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    keys = {r["recipe_key"] for r in runs}
    return runs[-1].get("recipe_json") if len(keys) == 1 and runs else None


def _same_configuration(runs: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    return [r for r in runs if r["recipe_key"] == key]


def resolve_group(runs: list[dict[str, Any]], ref: str) -> Group:
    """The group ``ref`` names (see the module docstring); unknown names are a usage error."""
    ref = ref.strip()
    if not ref:
        raise UsageError("an empty group: give a run name, a glob of run names, a comma list or a recipe")
    if "," in ref:
        chosen = [find_run(runs, part.strip()) for part in ref.split(",") if part.strip()]
        return Group(ref, chosen, _shared_recipe(chosen))
    if any(ch in ref for ch in "*?[") and " " not in ref:
        chosen = [r for r in runs if fnmatch.fnmatchcase(r["name"], ref)]
        if not chosen:
            raise UsageError(f"no run name in the ledger matches {ref!r}; `trnf runs` lists them")
        return Group(ref, chosen, _shared_recipe(chosen))
    words = ref.split()
    is_run = len(words) == 1 and (
        reader.is_run_dir(Path(ref).expanduser()) or any(r["name"] == ref for r in runs)
    )
    if is_run:
        anchor = find_run(runs, ref)
        if not any(r["run_dir"] == anchor["run_dir"] for r in runs):
            runs = [*runs, anchor]
        chosen = _same_configuration(runs, anchor["recipe_key"])
        recipe = anchor.get("recipe_json")
        return Group(f"{ref} (configuration {anchor['recipe_key']})", chosen, recipe, anchor["run_dir"])
    return _recipe_group(runs, words)


def _recipe_group(runs: list[dict[str, Any]], words: list[str]) -> Group:
    from trnfrontier.recipes.loading import load_recipe

    recipe_ref, overrides = words[0], words[1:]
    for item in overrides:
        if "=" not in item:
            raise UsageError(
                f"{' '.join(words)!r}: after the recipe come key.path=value overrides; {item!r} is not one"
            )
    recipe = load_recipe(recipe_ref, overrides).model_dump(mode="json")
    key = reader.recipe_key(recipe)
    label = " ".join(words) + f" (configuration {key})"
    return Group(label, _same_configuration(runs, key), recipe, recipe_ref, overrides)
