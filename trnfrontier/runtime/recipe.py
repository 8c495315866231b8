"""Every recipe knob, typed, with its one default; and the resolved recipe the runtime holds.

The knobs are the fields of the ``*Spec`` dataclasses below: their types and defaults are
defined here and nowhere else. The tool validates a recipe with pydantic
(``trnfrontier/recipes/schema.py``, whose sections take these defaults and add bounds and
descriptions) and hands the runtime ``Recipe.model_dump(mode="json")``, plain data,
because a submission carries the runtime without pydantic. ``ResolvedRecipe.from_dict``
turns that data into these stdlib dataclasses at the runtime's door (a missing or unknown
key is an error naming it), so the runtime reads ``recipe.budget.seconds``, never
``cfg["budget"].get("seconds", ...)``. ``Recipe.resolved()`` builds one from the schema.

Arithmetic both sides need is defined here once: the model's width and heads
(``model_shape``) and the gradient-accumulation steps (``grad_accum_steps``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from trnfrontier.runtime.budget_rule import (
    BUDGET_SECONDS,
    STARTUP_CAP_SECONDS,
    STARTUP_STEPS_EXCLUDED,
)

# The competition phase a recipe is for when it names none (``contract/phases.py`` holds the
# phases; it takes this number, since the runtime may not import the tool layer).
DEFAULT_PHASE = 1


class RecipeError(ValueError):
    """A resolved recipe that is missing keys, has unknown ones, or breaks the geometry."""


def model_shape(
    depth: int,
    aspect_ratio: int,
    head_dim: int,
    n_embd: int | None = None,
    n_head: int | None = None,
    n_kv_head: int | None = None,
) -> tuple[int, int, int]:
    """(n_embd, n_head, n_kv_head): width = depth x aspect_ratio rounded up to a whole
    number of heads unless ``n_embd`` is given; n_head = n_embd // head_dim unless given;
    n_kv_head defaults to n_head. Raises RecipeError for shapes that cannot work."""
    width = n_embd if n_embd is not None else -(-(depth * aspect_ratio) // head_dim) * head_dim
    heads = n_head if n_head is not None else width // head_dim
    if heads < 1:
        raise RecipeError(f"n_embd={width} is smaller than head_dim={head_dim}")
    if n_head is not None and n_head * head_dim != width:
        raise RecipeError(f"n_head x head_dim = {n_head} x {head_dim} != n_embd={width}")
    if width % head_dim:
        raise RecipeError(f"n_embd={width} is not a multiple of head_dim={head_dim}")
    kv = n_kv_head if n_kv_head is not None else heads
    check_heads(width, heads, kv)
    return width, heads, kv


def check_heads(n_embd: int, n_head: int, n_kv_head: int) -> None:
    """The rule every model's attention obeys, however its shape was given (a recipe's
    knobs through ``model_shape``, or a checkpoint's ``GPTConfig``): whole heads of an
    even width (rotary embeddings rotate channel pairs), and key/value heads that divide
    the query heads (grouped-query attention). Raises RecipeError (a ValueError)."""
    if n_head < 1 or n_embd % n_head:
        raise RecipeError(f"n_embd={n_embd} is not a multiple of n_head={n_head}")
    if (n_embd // n_head) % 2:
        raise RecipeError(f"head_dim={n_embd // n_head} must be even (rotary embeddings rotate channel pairs)")
    if n_kv_head < 1 or n_kv_head > n_head or n_head % n_kv_head:
        raise RecipeError(f"n_kv_head={n_kv_head} must divide n_head={n_head} (grouped-query attention)")


def grad_accum_steps(batch_size: int, sequence_len: int, world_size: int, total_batch_tokens: int | None) -> int:
    """Micro-steps per optimizer step so that a step sees ``total_batch_tokens`` over all
    ranks (one micro-step on every rank when it is None)."""
    micro = batch_size * sequence_len * world_size
    total = total_batch_tokens or micro
    if total % micro:
        raise RecipeError(
            f"data.total_batch_tokens={total} is not a multiple of batch_size x sequence_len x world size "
            f"= {batch_size} x {sequence_len} x {world_size} = {micro}"
        )
    return total // micro


# Every knob of a recipe is a field below, with its type and its default: the one
# definition of both. The pydantic schema (recipes/schema.py) takes its fields' defaults
# (and, where it declares none, their types) from these classes and adds bounds and
# descriptions; tests/recipes/test_knob_defaults.py holds the two equal. Add a knob here,
# then use it where it acts; declare it in the schema only to bound or describe it.

KernelChoice = Literal["off", "auto", "on"]
DeviceName = Literal["auto", "cpu", "cuda", "neuron"]


@dataclass(frozen=True)
class ModelSpec:
    depth: int = 10
    aspect_ratio: int = 64
    head_dim: int = 128
    n_embd: int | None = None
    n_head: int | None = None
    n_kv_head: int | None = None
    mlp_ratio: int = 4
    vocab_size: int = 8192
    sequence_len: int = 1024
    softcap: float = 15.0
    value_embeds: bool = False
    rope_base: float = 10000.0

    def shape(self) -> tuple[int, int, int]:
        """(n_embd, n_head, n_kv_head), see ``model_shape``."""
        return model_shape(self.depth, self.aspect_ratio, self.head_dim, self.n_embd, self.n_head, self.n_kv_head)


@dataclass(frozen=True)
class OptimSpec:
    matrix_lr: float = 0.02
    embedding_lr: float = 0.2
    unembedding_lr: float = 0.004
    scalar_lr: float = 0.5
    lr_width_scaling: bool = True
    lr_batch_scaling: bool = True
    reference_batch_tokens: int = 524_288  # nanochat's batch (2^19 tokens), where its LRs apply unscaled
    adam_betas: tuple[float, float] = (0.8, 0.95)
    adam_eps: float = 1e-10
    weight_decay: float = 0.0
    cautious_weight_decay: bool = False
    muon_momentum: float = 0.95
    muon_momentum_warmup_start: float = 0.85
    muon_momentum_warmup_steps: int = 300
    nesterov: bool = True
    polar_express_steps: int = 5
    normuon: bool = False
    normuon_beta2: float = 0.95
    grad_clip: float = 0.0
    sharded: bool | Literal["auto"] = "auto"  # sharded_optim.resolve_sharded decides "auto"


@dataclass(frozen=True)
class ScheduleSpec:
    mode: Literal["time", "steps"] = "time"
    warmup_frac: float = 0.0
    warmup_steps: int = 0
    warmdown_frac: float = 0.4
    final_lr_frac: float = 0.0
    total_steps: int | None = None


@dataclass(frozen=True)
class DataSpec:
    dataset: str | None = None
    batch_size: int = 32
    total_batch_tokens: int | None = None


@dataclass(frozen=True)
class BudgetSpec:
    seconds: float = BUDGET_SECONDS
    startup_steps_excluded: int = STARTUP_STEPS_EXCLUDED
    startup_allowance_cap_seconds: float = STARTUP_CAP_SECONDS
    checkpoint_reserve_seconds: float = 30.0
    competition: bool = True
    max_steps: int | None = None


@dataclass(frozen=True)
class RuntimeSpec:
    device: DeviceName = "auto"
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    compile: bool | Literal["auto"] = "auto"  # compiling.compile_enabled decides "auto"
    seed: int = 1337
    nproc: int = 1
    lnc: int = 2
    threads: int | None = None


# The override path of RuntimeSpec.seed: what a sweep's seeds set and tables group apart.
SEED_KEY = "runtime.seed"


@dataclass(frozen=True)
class EvalSpec:
    tokens: int = 2_097_152  # the contract's public evaluation (4 x 524,288)
    seq_len: int = 1024  # the contract's evaluation context
    batch_size: int = 8
    every_seconds: float | None = None
    final: bool = True


@dataclass(frozen=True)
class KernelsSpec:
    """Per NKI kernel: off (plain PyTorch), auto (the kernel where it can run) or on."""

    relu2: KernelChoice = "off"
    rmsnorm: KernelChoice = "off"
    rope_qknorm: KernelChoice = "off"
    cross_entropy: KernelChoice = "off"
    polar_express: KernelChoice = "off"
    attention: KernelChoice = "off"  # unmeasured on hardware: off until a Trn2 shows it faster


@dataclass(frozen=True)
class RunSpec:
    log_every_steps: int = 1
    checkpoint_every_seconds: float | None = 300.0
    max_loss: float = 20.0


_S = TypeVar("_S")


def _section(cls: type[_S], data: Any, where: str, *, partial: bool = False) -> _S:
    if not isinstance(data, dict):
        raise RecipeError(f"resolved recipe: {where} must be a mapping, not {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise RecipeError(f"resolved recipe: unknown key {where}.{unknown[0]}")
    missing = [] if partial else [name for name in fields if name not in data]
    if missing:
        raise RecipeError(f"resolved recipe: {where}.{missing[0]} is missing (resolve it with trnf's recipe schema)")
    values = dict(data)
    if "adam_betas" in values:
        values["adam_betas"] = tuple(values["adam_betas"])
    return cls(**values)


@dataclass(frozen=True)
class ResolvedRecipe:
    name: str
    description: str
    model: ModelSpec
    optim: OptimSpec
    schedule: ScheduleSpec
    data: DataSpec
    budget: BudgetSpec
    runtime: RuntimeSpec
    eval: EvalSpec
    kernels: KernelsSpec
    run: RunSpec
    # The competition phase (1 or 2); recipe.json leaves the default out, so it is optional here.
    phase: int = DEFAULT_PHASE

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ResolvedRecipe:
        """From ``Recipe.model_dump(mode="json")`` (recipe.json, a train.py's RECIPE)."""
        if not isinstance(data, dict):
            raise RecipeError(f"a resolved recipe is a mapping, not {type(data).__name__}")
        sections = {f.name: f.type for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(sections))
        if unknown:
            raise RecipeError(f"resolved recipe: unknown section {unknown[0]}")
        missing = [name for name in sections if name not in data and name != "phase"]
        if missing:
            raise RecipeError(f"resolved recipe: {missing[0]} is missing (resolve it with trnf's recipe schema)")
        return cls(
            name=str(data["name"]),
            description=str(data["description"]),
            model=_section(ModelSpec, data["model"], "model"),
            optim=_section(OptimSpec, data["optim"], "optim"),
            schedule=_section(ScheduleSpec, data["schedule"], "schedule"),
            data=_section(DataSpec, data["data"], "data"),
            budget=_section(BudgetSpec, data["budget"], "budget"),
            runtime=_section(RuntimeSpec, data["runtime"], "runtime"),
            eval=_section(EvalSpec, data["eval"], "eval"),
            kernels=_section(KernelsSpec, data["kernels"], "kernels"),
            run=_section(RunSpec, data["run"], "run"),
            phase=_phase(data.get("phase", DEFAULT_PHASE)),
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data, equal to the ``model_dump(mode="json")`` it came from."""
        data = dataclasses.asdict(self)
        data["optim"]["adam_betas"] = list(self.optim.adam_betas)
        if self.phase == DEFAULT_PHASE:
            del data["phase"]  # as the schema writes it: Phase 1 recipes are unchanged
        return data

    def grad_accum_steps(self, world_size: int) -> int:
        return grad_accum_steps(self.data.batch_size, self.model.sequence_len, world_size, self.data.total_batch_tokens)


def _phase(value: Any) -> int:
    if type(value) is not int or value not in (1, 2):
        raise RecipeError(f"resolved recipe: phase={value!r} must be 1 or 2")
    return value
