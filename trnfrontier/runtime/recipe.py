"""The resolved recipe as the runtime holds it: typed, every key present, shapes derived once.

The tool validates a recipe with pydantic (``trnfrontier/recipes/schema.py``) and hands
the runtime ``Recipe.model_dump(mode="json")``, plain data, because a submission carries
the runtime without pydantic. ``ResolvedRecipe.from_dict`` turns that data into these
stdlib dataclasses at the runtime's door (a missing or unknown key is an error naming it),
so the trainer reads ``recipe.budget.seconds``, not ``cfg["budget"].get("seconds", ...)``.
``Recipe.resolved()`` builds one from the schema.

Arithmetic both sides need is defined here once: the model's width and heads
(``model_shape``) and the gradient-accumulation steps (``grad_accum_steps``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar


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
    if head_dim % 2:
        raise RecipeError(f"head_dim={head_dim} must be even (rotary embeddings rotate channel pairs)")
    width = n_embd if n_embd is not None else -(-(depth * aspect_ratio) // head_dim) * head_dim
    heads = n_head if n_head is not None else width // head_dim
    if heads < 1:
        raise RecipeError(f"n_embd={width} is smaller than head_dim={head_dim}")
    if n_head is not None and n_head * head_dim != width:
        raise RecipeError(f"n_head x head_dim = {n_head} x {head_dim} != n_embd={width}")
    if width % head_dim:
        raise RecipeError(f"n_embd={width} is not a multiple of head_dim={head_dim}")
    kv = n_kv_head if n_kv_head is not None else heads
    if kv < 1 or kv > heads or heads % kv:
        raise RecipeError(f"n_kv_head={kv} must divide n_head={heads} (grouped-query attention)")
    return width, heads, kv


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


@dataclass(frozen=True)
class ModelSpec:
    # Defaults only here, for callers that build a model from a partial section (tests,
    # benchmarks); the schema's defaults are checked against these in tests/recipes.
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
    matrix_lr: float
    embedding_lr: float
    unembedding_lr: float
    scalar_lr: float
    lr_width_scaling: bool
    lr_batch_scaling: bool
    reference_batch_tokens: int
    adam_betas: tuple[float, float]
    adam_eps: float
    weight_decay: float
    cautious_weight_decay: bool
    muon_momentum: float
    muon_momentum_warmup_start: float
    muon_momentum_warmup_steps: int
    nesterov: bool
    polar_express_steps: int
    normuon: bool
    normuon_beta2: float
    grad_clip: float


@dataclass(frozen=True)
class ScheduleSpec:
    mode: str  # "time" | "steps"
    warmup_frac: float
    warmup_steps: int
    warmdown_frac: float
    final_lr_frac: float
    total_steps: int | None


@dataclass(frozen=True)
class DataSpec:
    dataset: str | None
    batch_size: int
    total_batch_tokens: int | None


@dataclass(frozen=True)
class BudgetSpec:
    seconds: float
    startup_steps_excluded: int
    startup_allowance_cap_seconds: float
    checkpoint_reserve_seconds: float
    competition: bool
    max_steps: int | None


@dataclass(frozen=True)
class RuntimeSpec:
    device: str
    dtype: str
    compile: bool | str  # true, false or "auto" (compiling.compile_enabled decides)
    seed: int
    nproc: int
    lnc: int
    threads: int | None


@dataclass(frozen=True)
class EvalSpec:
    tokens: int
    seq_len: int
    batch_size: int
    every_seconds: float | None
    final: bool


@dataclass(frozen=True)
class RunSpec:
    log_every_steps: int
    checkpoint_every_seconds: float | None
    max_loss: float


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
    kernels: dict[str, str]  # kernel -> "off" | "auto" | "on"
    run: RunSpec

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ResolvedRecipe:
        """From ``Recipe.model_dump(mode="json")`` (recipe.json, a train.py's RECIPE)."""
        if not isinstance(data, dict):
            raise RecipeError(f"a resolved recipe is a mapping, not {type(data).__name__}")
        sections = {f.name: f.type for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(sections))
        if unknown:
            raise RecipeError(f"resolved recipe: unknown section {unknown[0]}")
        missing = [name for name in sections if name not in data]
        if missing:
            raise RecipeError(f"resolved recipe: {missing[0]} is missing (resolve it with trnf's recipe schema)")
        kernels = data["kernels"]
        if not isinstance(kernels, dict):
            raise RecipeError("resolved recipe: kernels must be a mapping")
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
            kernels={str(k): str(v) for k, v in kernels.items()},
            run=_section(RunSpec, data["run"], "run"),
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data, equal to the ``model_dump(mode="json")`` it came from."""
        data = dataclasses.asdict(self)
        data["optim"]["adam_betas"] = list(self.optim.adam_betas)
        return data

    def grad_accum_steps(self, world_size: int) -> int:
        return grad_accum_steps(self.data.batch_size, self.model.sequence_len, world_size, self.data.total_batch_tokens)


def model_spec(section: ModelSpec | dict[str, Any]) -> ModelSpec:
    """A ModelSpec from a resolved recipe's ``model`` section (missing keys take defaults)."""
    return section if isinstance(section, ModelSpec) else _section(ModelSpec, section, "model", partial=True)
