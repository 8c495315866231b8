"""`trnf compare --seeds N`: train the seeds a side is missing, one after another.

Each new run is the side's configuration with another ``runtime.seed``, trained exactly
as `trnf train` trains (same planning, same checks, same run directory layout, recorded in
the ledger). Both sides draw seeds in the same order (the recipe's seed, then +1, +2, ...),
so sides started together end up on the same seeds.
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from trnfrontier.errors import TrnfError
from trnfrontier.ledger import reader, record
from trnfrontier.ledger.groups import Group
from trnfrontier.runtime.rundir import COMPLETED

RUNS_DIR = Path("runs")
Say = Callable[[str], None]


def missing_seeds(group: Group, wanted: int) -> list[int]:
    """Seeds to train so that the side has ``wanted`` runs."""
    if group.recipe is None:
        raise TrnfError(
            f"{group.label}: its runs do not share one configuration, so there is no recipe to train more seeds of; "
            "name a recipe or one run instead"
        )
    have = {r.get("seed") for r in group.runs}
    base = int(group.recipe["runtime"]["seed"])
    seeds: list[int] = []
    candidate = base
    while len(have) + len(seeds) < wanted:
        if candidate not in have:
            seeds.append(candidate)
        candidate += 1
    return seeds


def _run_name(base: str, key: str, seed: int) -> str:
    """``cpu_smoke-3f2a1c-seed1338``: the configuration's key tells two sides' runs apart."""
    name = f"{base}-{key[:6]}-seed{seed}"
    suffix = 2
    while (RUNS_DIR / name).exists():
        name = f"{base}-{key[:6]}-seed{seed}-{suffix}"
        suffix += 1
    return name


def train_seed(group: Group, seed: int, say: Say, warn: Say) -> dict[str, Any]:
    """Train one more seed of ``group``'s configuration; returns the run's summary."""
    from trnfrontier.recipes.registry import resolve_recipe_path
    from trnfrontier.train.plan import plan_new_run
    from trnfrontier.train.supervise import run_plan

    assert group.recipe is not None
    recipe = copy.deepcopy(group.recipe)
    recipe["runtime"]["seed"] = seed
    name = _run_name(str(recipe["name"]), reader.recipe_key(recipe), seed)  # the recipe keeps its name: runs/<name> differs
    with tempfile.TemporaryDirectory(prefix="trnf-seed-") as scratch:
        path = Path(scratch) / f"{name}.yaml"
        # safe_dump writes floats YAML reads back as floats (1.0e-10, where JSON's 1e-10
        # would be a string to YAML 1.1).
        path.write_text(yaml.safe_dump(recipe, sort_keys=False), encoding="utf-8")
        plan = plan_new_run(str(path), [], name=name)
    ref = group.recipe_ref or str(recipe["name"])
    recipe_path = resolve_recipe_path(ref) if group.recipe_ref else None
    overrides = [*group.overrides, f"runtime.seed={seed}"]
    record.start_run(
        plan.run_dir, str(group.recipe["name"]), ref, recipe_path if recipe_path and recipe_path.exists() else None,
        overrides, recipe["data"].get("dataset"), warn,
    )  # fmt: skip
    say(f"training {plan.run_dir} (seed {seed}) ...")
    summary = run_plan(plan, live=True)
    record.index_run(plan.run_dir, warn)
    if summary.get("status") != COMPLETED:
        warn(f"{plan.run_dir}: {summary.get('status')} ({summary.get('error') or summary.get('stop_reason')}); it is left out")
    return summary


def fill_seeds(a: Group, b: Group, wanted: int, say: Say, warn: Say) -> int:
    """Train what each side lacks for ``wanted`` runs; returns how many runs were trained."""
    plan = [(group, seed) for group in (a, b) for seed in missing_seeds(group, wanted)]
    if plan:
        say(f"--seeds {wanted}: training {len(plan)} run{'s' if len(plan) != 1 else ''}, one after another")
    for group, seed in plan:
        train_seed(group, seed, say, warn)
    return len(plan)
