"""`trnf doctor`: the first command on a new machine (see environment.py, kernel_checks.py).

Importing this package imports no torch: the environment checks read package metadata
and /dev; only ``--kernels`` imports torch (and the Neuron packages where they exist).
"""

from __future__ import annotations

from typing import Any


def report(recipe_name: str, kernels: bool = False) -> dict[str, Any]:
    """The doctor's JSON document for ``recipe_name`` (its runtime.lnc, nproc and shapes)."""
    from trnfrontier.recipes import load_recipe

    from .environment import environment_report

    recipe = load_recipe(recipe_name)
    doc: dict[str, Any] = {
        "recipe": recipe.name,
        "environment": environment_report(recipe.runtime.lnc, recipe.runtime.nproc),
    }
    if kernels:
        from .kernel_checks import kernel_report

        doc["kernels"] = kernel_report(recipe)
    statuses = [doc["environment"]["status"], doc.get("kernels", {}).get("status", "ok")]
    doc["status"] = next((s for s in ("fail", "warn") if s in statuses), "ok")
    return doc
