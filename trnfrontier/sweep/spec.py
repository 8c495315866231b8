"""The sweep file: what to train, what to vary, how to search, how much at once.

```yaml
name: lr_smoke
recipe: cpu_smoke                      # or train_py: path/to/train.py (+ args: [...])
overrides: [budget.max_steps=40]       # the same for every trial
space:                                 # recipe keys (kit: the script's --flags)
  optim.matrix_lr: {grid: [0.01, 0.02, 0.04]}
  optim.embedding_lr: {loguniform: [0.1, 1.0]}
  model.depth: {choice: [1, 2]}
  data.batch_size: {int: [8, 32]}      # inclusive
seeds: [1337, 1338]                    # every configuration once per seed (grid, random)
metric: val_bpb                        # and mode: min (the metric's natural direction)
search: grid                           # grid | random | optuna (TPE)
trials: 8                              # random / optuna: configurations to try
concurrency: 2
nproc: 1                               # processes per trial: runtime.nproc (kit: --nproc); default the recipe's
resources: {cpu: 1, gpu: 0, neuron_cores: 0}   # per trial; Ray schedules on them
early_stop: {reports: 4, grace_period: 0.25, reduction_factor: 2}   # ASHA, or omit
```

Validated like a recipe: unknown keys, wrong types and impossible combinations are one
line naming the key. Every value a dimension can take is checked against the recipe
before anything starts, so a trial cannot fail on a bad override an hour in.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from trnfrontier.contract.kit import OUT_DIR_FLAG
from trnfrontier.errors import TrnfError
from trnfrontier.runtime.recipe import SEED_KEY

# Metrics a trial's summary.json (or its scores) holds, and the direction that is better.
METRICS = {"val_bpb": "min", "final_loss": "min", "core": "max", "tokens_per_second": "max", "mfu": "max"}
KINDS = ("grid", "choice", "uniform", "loguniform", "int")
NPROC_KEY = "runtime.nproc"  # what `trnf train --nproc` sets


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class Dimension(_Strict):
    """One swept key: exactly one of the kinds below."""

    grid: list[Any] | None = Field(None, min_length=1, description="Every value, each in its own trial.")
    choice: list[Any] | None = Field(None, min_length=1, description="Sampled among these (random, optuna).")
    uniform: list[float] | None = Field(None, min_length=2, max_length=2, description="[low, high].")
    loguniform: list[float] | None = Field(None, min_length=2, max_length=2, description="[low, high], low > 0.")
    integer: list[int] | None = Field(None, alias="int", min_length=2, max_length=2, description="[low, high], both included.")

    @model_validator(mode="after")
    def _one_kind(self) -> Dimension:
        given = [kind for kind in KINDS if self.values_of(kind) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(KINDS)} (got {', '.join(given) or 'none'})")
        bounds = self.range
        if bounds is not None:
            low, high = bounds
            if not low < high:
                raise ValueError(f"{self.kind}: low {low} must be below high {high}")
            if self.kind == "loguniform" and low <= 0:
                raise ValueError(f"loguniform: low {low} must be above 0")
        return self

    def values_of(self, kind: str) -> list[Any] | None:
        values: list[Any] | None = getattr(self, "integer" if kind == "int" else kind)
        return values

    @property
    def kind(self) -> str:
        return next(kind for kind in KINDS if self.values_of(kind) is not None)

    @property
    def range(self) -> tuple[float, float] | None:
        values = self.uniform or self.loguniform or self.integer
        return (values[0], values[1]) if values else None

    def probes(self) -> list[Any]:
        """Values that stand for every value this dimension can take (checked up front)."""
        return list(self.grid or self.choice or self.range or [])


class Resources(_Strict):
    """What one trial holds while it runs; Ray starts a trial only where these are free."""

    cpu: float = Field(1.0, ge=0, description="CPU cores.")
    gpu: float = Field(0.0, ge=0, description="GPUs (CUDA_VISIBLE_DEVICES is set per trial).")
    neuron_cores: int = Field(0, ge=0, description="NeuronCores (NEURON_RT_VISIBLE_CORES is set per trial).")


class EarlyStop(_Strict):
    """ASHA on the training loss a trial reaches at fixed fractions of its budget."""

    reports: int = Field(4, ge=2, le=100, description="Loss reports per trial, at 1/N, 2/N, ... of its budget.")
    grace_period: float = Field(0.25, gt=0, lt=1, description="No trial is stopped before this fraction.")
    reduction_factor: float = Field(2.0, gt=1, description="Keep the best 1/this at each rung.")


class SweepSpec(_Strict):
    name: str = Field(..., min_length=1, max_length=60, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    recipe: str | None = Field(None, description="Base recipe (shipped name or YAML path).")
    overrides: list[str] = Field(default_factory=list, description="key.path=value for every trial.")
    train_py: str | None = Field(None, description="A kit-style train.py instead of a recipe.")
    args: list[str] = Field(default_factory=list, description="train_py: flags for every trial.")
    nproc: int | None = Field(None, ge=1, description="Processes per trial (torchrun): a recipe's runtime.nproc (default the recipe's), a train_py's --nproc (default 1).")
    space: dict[str, Dimension] = Field(default_factory=dict)
    seeds: list[int] | None = Field(None, min_length=1, description="Recipe runs: each configuration once per seed.")
    metric: Literal["val_bpb", "final_loss", "core", "tokens_per_second", "mfu"] = "val_bpb"
    mode: Literal["min", "max"] | None = None
    core_args: list[str] = Field(default_factory=list, description="metric: core: more `trnf eval --core` flags (--bundle, --max-per-task).")
    search: Literal["grid", "random", "optuna"] = "grid"
    trials: int | None = Field(None, ge=1, le=10_000, description="random/optuna: configurations; grid: repeats.")
    search_seed: int = Field(0, ge=0, description="Seed of the search algorithm's own sampling.")
    concurrency: int = Field(1, ge=1, le=1024)
    resources: Resources = Field(default_factory=Resources)
    early_stop: EarlyStop | None = None

    @model_validator(mode="after")
    def _coherent(self) -> SweepSpec:
        if (self.recipe is None) == (self.train_py is None):
            raise ValueError("give recipe (a recipe to vary) or train_py (a kit script), exactly one")
        if self.train_py is not None:
            if self.overrides:
                raise ValueError("overrides are recipe keys; a train_py sweep takes its fixed flags in args")
            if self.seeds is not None:
                raise ValueError("seeds: a kit train.py has no seed trnf can set; sweep its seed flag in space")
            if self.early_stop is not None:
                # ASHA judges the training loss a trial reports at fractions of its budget; a kit
                # run reports none (its budget and losses are the script's own), so it would judge noise.
                raise ValueError("early_stop: a kit train.py reports no training loss to stop on; drop early_stop")
            bad = [key for key in self.space if not key.startswith("-")]
            if bad:
                raise ValueError(f"space.{bad[0]}: a train_py sweep varies the script's flags (--name)")
            chosen = [word for word in [*self.args, *self.space] if word.split("=", 1)[0] == OUT_DIR_FLAG]
            if chosen and self.concurrency > 1:
                # Each trial writes its checkpoint into its own run directory, through the
                # kit's NEURON_COMPETITION_R1_OUT_DIR (kit/out_dir.py); a fixed --out-dir
                # would send every trial to one folder.
                where = "args" if chosen[0] in self.args else f"space.{chosen[0]}"
                raise ValueError(f"{where}: {OUT_DIR_FLAG} would send trials running at once into one folder; drop it "
                                 "(trnf gives each trial its own) or set concurrency: 1")
        elif self.args:
            raise ValueError("args are a train_py's flags; a recipe sweep takes overrides")
        elif self.nproc is not None:
            named = [word for word in [*self.overrides, *self.space] if word.split("=", 1)[0] == NPROC_KEY]
            if named:
                where = "overrides" if named[0] in self.overrides else f"space.{NPROC_KEY}"
                raise ValueError(f"nproc: {where} sets {NPROC_KEY} too; give the process count once")
        kinds = {key: dim.kind for key, dim in self.space.items()}
        if self.search == "grid":
            sampled = [key for key, kind in kinds.items() if kind != "grid"]
            if sampled:
                raise ValueError(f"search: grid tries listed values; space.{sampled[0]} is {kinds[sampled[0]]}: use search: random or optuna")
        if self.search == "optuna":
            gridded = [key for key, kind in kinds.items() if kind == "grid"]
            if gridded:
                raise ValueError(f"search: optuna samples; space.{gridded[0]} is grid: write it as choice")
            if self.seeds is not None and len(self.seeds) > 1:
                raise ValueError("seeds: optuna tries one seed per configuration; more seeds of the best: `trnf compare --seeds`")
        if self.search != "grid" and self.trials is None:
            raise ValueError(f"trials: search: {self.search} needs how many configurations to try")
        if self.core_args and self.metric != "core":
            raise ValueError("core_args: flags of the CORE evaluation, for metric: core")
        if not self.space and not self.seeds:
            raise ValueError("space: nothing to vary (give space keys or several seeds)")
        return self

    @property
    def direction(self) -> str:
        return self.mode or METRICS[self.metric]

    def base_overrides(self) -> list[str]:
        """A recipe sweep's overrides for every trial: the spec's, then nproc as runtime.nproc."""
        return [*self.overrides, *([override(NPROC_KEY, self.nproc)] if self.nproc is not None else [])]

    def expected_trials(self) -> int:
        """How many trials the sweep runs in all."""
        seeds = len(self.seeds or [None])
        if self.search == "grid":
            grid = math.prod(len(dim.grid or []) for dim in self.space.values())
            return grid * seeds * (self.trials or 1)
        return (self.trials or 1) * seeds


def read_spec(path: Path) -> SweepSpec:
    """Read and validate a sweep file; every problem is one TrnfError line."""
    from trnfrontier.recipes.loading import format_validation_error, load_yaml

    if not path.is_file():
        raise TrnfError(f"sweep spec {path} not found; give a sweep YAML file (see sweeps/)", exit_code=2)
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = " ".join(str(getattr(exc, "problem", None) or str(exc).splitlines()[0]).split())
        raise TrnfError(f"sweep spec {path} is not valid YAML{where}: {problem}", exit_code=2) from None
    except UnicodeDecodeError:
        raise TrnfError(f"sweep spec {path} is not UTF-8 text", exit_code=2) from None
    if not isinstance(data, dict):
        raise TrnfError(f"sweep spec {path} must be a YAML mapping of keys (name, recipe, space, ...)", exit_code=2)
    data.setdefault("name", path.stem)
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as exc:
        raise TrnfError(
            format_validation_error(exc, str(path), SweepSpec, "sweep spec", "see sweeps/ for an example"),
            exit_code=2,
        ) from None
    check_against_recipe(spec, path)
    return spec


# A value as a `trnf train` override word (the trial's, and the probes checked here).
def scalar(value: Any) -> str:
    """``value`` as YAML reads it back to the same thing (``1e-05`` would be a string to
    YAML 1.1; ``1.0e-05`` is a float)."""
    if isinstance(value, str):
        return value if yaml.safe_load(value) == value else yaml.safe_dump(value).strip().removesuffix("...").strip()
    text = yaml.safe_dump(value, default_flow_style=True).strip()
    return text.removesuffix("...").strip()


def override(key: str, value: Any) -> str:
    return f"{key}={scalar(value)}"


def check_against_recipe(spec: SweepSpec, source: Path) -> None:
    """Every override and every value a dimension can take, applied to the recipe: a typo
    in a key or a value out of its bounds is found now, named by the space key."""
    if spec.recipe is None:
        if not Path(spec.train_py or "").is_file():
            raise TrnfError(f"{source}: train_py: {spec.train_py} not found", exit_code=2)
        return
    from trnfrontier.recipes.loading import load_recipe

    load_recipe(spec.recipe, spec.overrides)  # the base itself (its own one-line errors)
    base = spec.base_overrides()
    if spec.nproc is not None:
        try:
            load_recipe(spec.recipe, base)
        except TrnfError as exc:
            raise TrnfError(f"{source}: nproc: {spec.nproc}: {exc}", exit_code=2) from None
    for key, dim in spec.space.items():
        for value in dim.probes():
            probe = int(value) if dim.kind == "int" else value
            try:
                load_recipe(spec.recipe, [*base, override(key, probe)])
            except TrnfError as exc:
                raise TrnfError(f"{source}: space.{key} = {probe!r}: {exc}", exit_code=2) from None
    for seed in spec.seeds or []:
        try:
            load_recipe(spec.recipe, [*base, override(SEED_KEY, seed)])
        except TrnfError as exc:
            raise TrnfError(f"{source}: seeds: {seed}: {exc}", exit_code=2) from None
