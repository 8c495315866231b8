"""The spec's search space as Ray Tune's, and one trial's values as `trnf train` words.

A trial's configuration is a flat dict: each space key (a recipe key path, or a kit
script's ``--flag``) and, where seeds are swept, ``runtime.seed``, to its value.
"""

from __future__ import annotations

from typing import Any

from trnfrontier.runtime.recipe import SEED_KEY
from trnfrontier.sweep.spec import SweepSpec, override, scalar


def plain(value: Any) -> Any:
    """Numpy scalars (what some samplers return) as Python numbers, for JSON and YAML."""
    item = getattr(value, "item", None)
    return item() if callable(item) and not isinstance(value, (list, dict, str)) else value


def tune_space(spec: SweepSpec) -> dict[str, Any]:
    """Ray Tune's ``param_space`` for the spec (ray imported here, never at trnf start)."""
    from ray import tune

    space: dict[str, Any] = {}
    for key, dim in spec.space.items():
        kind = dim.kind
        if kind == "grid":
            space[key] = tune.grid_search(list(dim.grid or []))
        elif kind == "choice":
            space[key] = tune.choice(list(dim.choice or []))
        else:
            low, high = dim.range or (0.0, 1.0)
            if kind == "uniform":
                space[key] = tune.uniform(low, high)
            elif kind == "loguniform":
                space[key] = tune.loguniform(low, high)
            else:  # int, both ends included (Ray's randint excludes the upper one)
                space[key] = tune.randint(int(low), int(high) + 1)
    if spec.seeds:
        seeds = list(spec.seeds)
        space[SEED_KEY] = seeds[0] if len(seeds) == 1 else tune.grid_search(seeds)
    return space


def params_of(spec: SweepSpec, config: dict[str, Any]) -> dict[str, Any]:
    """The trial's swept values (space keys, then the seed), as plain JSON values."""
    keys = [*spec.space, *([SEED_KEY] if spec.seeds else [])]
    return {key: plain(config[key]) for key in keys if key in config}


def train_words(spec: SweepSpec, params: dict[str, Any], run_dir: str) -> list[str]:
    """What follows ``trnf train`` for a new trial: the recipe and its overrides (the
    spec's, nproc as runtime.nproc, then the trial's), or ``--train-py`` and the script's flags; into ``run_dir``."""
    if spec.recipe is not None:
        return [spec.recipe, *spec.base_overrides(), *(override(k, v) for k, v in params.items()), "--out", run_dir]
    flags = [*spec.args]
    for key, value in params.items():
        flags += [key, value if isinstance(value, str) else scalar(value)]
    return ["--train-py", str(spec.train_py), "--nproc", str(spec.nproc or 1), "--out", run_dir, "--", *flags]
