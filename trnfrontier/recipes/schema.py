"""The recipe schema: every knob of a training run, validated before any compute is spent.

``Recipe.model_dump(mode="json")`` is the *resolved recipe*: plain data that the runtime
layer (and a packaged train.py, which has no pydantic) reads key by key. Field names
here are therefore a contract with ``trnfrontier.runtime``; rename nothing lightly.

Each section is built from its runtime spec (``trnfrontier/runtime/recipe.py``), which
holds every knob's type and default. A section declares a field, with ``knob(...)`` and
never a default of its own, to bound or describe it, or so that tool code reading it is
type-checked; it takes the spec's other fields as they are. See ``Section``.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from trnfrontier.contract.phases import DEFAULT_PHASE, PHASES
from trnfrontier.runtime import recipe as spec
from trnfrontier.runtime.recipe import (
    DeviceName,
    KernelChoice,
    ResolvedRecipe,
    grad_accum_steps,
    model_shape,
)

# Seeds feed torch.manual_seed, numpy and random: a non-negative 64-bit signed integer
# is what all three take without overflow.
MAX_SEED = 2**63 - 1


class _Knob:
    """A field's bounds and description, waiting for its default from the runtime spec."""

    def __init__(self, constraints: dict[str, Any]) -> None:
        self.constraints = constraints


def knob(**constraints: Any) -> Any:
    """A section field's pydantic constraints (``ge=``, ``description=`` ...) without a
    default: ``Section.__init_subclass__`` gives it the runtime spec's."""
    return _Knob(constraints)


class Section(BaseModel):
    """One recipe section. ``class XSection(Section, spec=XSpec)`` makes every field of the
    runtime spec ``XSpec`` a field here, in the spec's order, with the spec's type and
    default; a field declared in the class body (``name: type = knob(...)``) adds its
    constraints. A field the spec lacks, a default written here or a type other than the
    spec's is refused when the class is defined (a TypeError at import)."""

    # strict: YAML already types every scalar, so a string where a number belongs
    # (`depth: '10'`) or a bool where a float belongs (`matrix_lr: yes`, which YAML 1.1
    # reads as true) is a mistake to report, not a value to coerce. allow_inf_nan=False:
    # no knob of a run means anything at infinity (`rope_base: .inf`, `grad_clip: .inf`).
    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True, allow_inf_nan=False)

    def __init_subclass__(cls, spec: type | None = None, **kwargs: Any) -> None:
        # Runs before pydantic collects the fields (it reads the class's annotations and
        # attributes after this returns), so what is set here is what it sees.
        super().__init_subclass__(**kwargs)
        if spec is not None:
            _fields_from_spec(cls, spec)


def _fields_from_spec(cls: type, spec_cls: type) -> None:
    """Make ``cls``'s fields those of the dataclass ``spec_cls`` (see ``Section``)."""
    # The class body's own annotations, evaluated in its module (not the bases').
    own = type("_Declared", (), {"__annotations__": cls.__dict__.get("__annotations__", {}), "__module__": cls.__module__})
    declared = typing.get_type_hints(own)
    knobs = {f.name: f for f in dataclasses.fields(spec_cls)}
    types = typing.get_type_hints(spec_cls)
    extra = sorted(set(declared) - set(knobs))
    if extra:
        raise TypeError(f"{cls.__name__}.{extra[0]} is not a field of {spec_cls.__name__}: add the knob there first")
    annotations: dict[str, Any] = {}
    for name, field in knobs.items():
        value = cls.__dict__.get(name)
        if name in declared and not isinstance(value, _Knob):
            raise TypeError(f"{cls.__name__}.{name}: declare it with knob(...); its default is {spec_cls.__name__}'s")
        if name in declared and declared[name] != types[name]:
            raise TypeError(f"{cls.__name__}.{name}: {declared[name]} is not {spec_cls.__name__}'s type {types[name]}")
        if field.default is dataclasses.MISSING:
            raise TypeError(f"{spec_cls.__name__}.{name} has no default; every knob needs one")
        annotations[name] = types[name]
        constraints = value.constraints if isinstance(value, _Knob) else {}
        setattr(cls, name, Field(field.default, **constraints))
    cls.__annotations__ = annotations


class ModelSection(Section, spec=spec.ModelSpec):
    """A nanochat-style GPT. Width comes from depth x aspect_ratio (rounded up to a whole
    number of heads) unless ``n_embd`` is given."""

    depth: int = knob(ge=1, le=128, description="Transformer blocks.")
    aspect_ratio: int = knob(ge=1, description="Width per layer of depth when n_embd is not given.")
    head_dim: int = knob(ge=8, le=256, description="Channels per attention head (even, for rotary).")
    n_embd: int | None = knob(ge=8, description="Explicit width; overrides depth x aspect_ratio.")
    n_head: int | None = knob(ge=1, description="Query heads; default n_embd // head_dim.")
    n_kv_head: int | None = knob(ge=1, description="Key/value heads (GQA when < n_head); default n_head.")
    mlp_ratio: int = knob(ge=1, le=16)
    vocab_size: int = knob(ge=256, description="Must equal the tokenizer's vocabulary.")
    sequence_len: int = knob(ge=8, le=65536, description="Training context length.")
    softcap: float = knob(ge=0.0, description="Logit softcap (0 disables).")
    value_embeds: bool = knob(description="Value embeddings mixed into attention values.")
    rope_base: float = knob(gt=0)

    @model_validator(mode="after")
    def _shapes(self) -> ModelSection:
        self.shape()  # RecipeError is a ValueError: pydantic reports it on this section
        return self

    def shape(self) -> tuple[int, int, int]:
        """(n_embd, n_head, n_kv_head), derived as the runtime derives them."""
        return model_shape(self.depth, self.aspect_ratio, self.head_dim, self.n_embd, self.n_head, self.n_kv_head)

    def resolved_n_embd(self) -> int:
        return self.shape()[0]


class OptimSection(Section, spec=spec.OptimSpec):
    """Muon (Polar Express) for the blocks' matrices; AdamW for embeddings, head and scalars."""

    matrix_lr: float = knob(gt=0, description="Muon learning rate for 2-D block weights.")
    embedding_lr: float = knob(gt=0, description="AdamW LR for token (and value) embeddings.")
    unembedding_lr: float = knob(gt=0, description="AdamW LR for the output head.")
    scalar_lr: float = knob(gt=0, description="AdamW LR for scalar / vector parameters.")
    lr_width_scaling: bool = knob(description="Scale AdamW LRs by (n_embd/768)^-0.5 as nanochat does.")
    lr_batch_scaling: bool = knob(
        description="Scale every LR by sqrt(tokens per step / reference_batch_tokens), nanochat's rule: "
        "the LRs above are tuned at the reference batch, and a smaller batch (noisier gradients) takes "
        "proportionally smaller steps (1/8 of them at 8,192 tokens).",
    )
    reference_batch_tokens: int = knob(
        ge=1, description="Tokens per step at which the LRs above apply unscaled (nanochat: 2^19)."
    )
    adam_betas: tuple[float, float] = knob(description="AdamW's (beta1, beta2), each in [0, 1).")
    adam_eps: float = knob(gt=0)
    weight_decay: float = knob(ge=0, description="Muon weight decay.")
    cautious_weight_decay: bool = knob(description="Decay only where update and weight agree in sign.")
    muon_momentum: float = knob(ge=0, lt=1)
    muon_momentum_warmup_start: float = knob(ge=0, lt=1)
    muon_momentum_warmup_steps: int = knob(
        ge=0, description="Steps over which Muon's momentum rises from muon_momentum_warmup_start (0: none)."
    )
    polar_express_steps: int = knob(ge=1, le=5)
    normuon: bool = knob(description="NorMuon: per-neuron second-moment normalisation of the update.")
    normuon_beta2: float = knob(ge=0, lt=1)
    grad_clip: float = knob(ge=0, description="Global grad-norm clip (0 disables).")
    sharded: bool | Literal["auto"] = knob(
        description="Split the optimizer across data-parallel ranks: gradients reduce-scattered, each rank "
        "runs Muon and AdamW on its share only, parameters all-gathered (runtime/sharded_optim.py). The same "
        "update bit for bit; auto: on with several ranks unless grad_clip is set (the clip's norm is then "
        "summed in another order).",
    )

    @field_validator("adam_betas", mode="before")
    @classmethod
    def _list_as_pair(cls, value: object) -> object:
        # YAML and JSON have no tuple: a two-item list is how a pair is written.
        return tuple(value) if isinstance(value, list) else value

    @model_validator(mode="after")
    def _betas(self) -> OptimSection:
        for beta in self.adam_betas:
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"adam_betas values must be in [0, 1), got {beta}")
        return self


class ScheduleSection(Section, spec=spec.ScheduleSpec):
    """LR multiplier over the run: warmup, flat, warmdown to final_lr_frac.

    ``mode: time`` drives it by the fraction of the training budget charged so far, so a
    slower step never leaves the run stuck at a high LR when time runs out; ``mode: steps``
    uses ``total_steps`` for fixed-step experiments.
    """

    mode: Literal["time", "steps"] = knob(description="time: by the charged share of the budget; steps: by total_steps.")
    warmup_frac: float = knob(ge=0, le=1)
    warmup_steps: int = knob(
        ge=0, description="Linear LR warm-up over the first N optimizer steps (nanochat: 40), with warmup_frac: the smaller ramp applies."
    )
    warmdown_frac: float = knob(ge=0, le=1)
    final_lr_frac: float = knob(ge=0, le=1)
    total_steps: int | None = knob(ge=1)

    @model_validator(mode="after")
    def _consistent(self) -> ScheduleSection:
        if self.warmup_frac + self.warmdown_frac > 1.0:
            raise ValueError("warmup_frac + warmdown_frac must be <= 1")
        if self.mode == "steps" and self.total_steps is None:
            raise ValueError("mode 'steps' needs total_steps")
        return self


class DataSection(Section, spec=spec.DataSpec):
    dataset: str | None = knob(description="Prepared dataset name (default: the active one).")
    batch_size: int = knob(ge=1, description="Rows per device per micro-step.")
    total_batch_tokens: int | None = knob(
        ge=1, description="Tokens per optimizer step over all ranks; default one micro-step on every rank."
    )


class BudgetSection(Section, spec=spec.BudgetSpec):
    """The organisers' clock. ``competition: true`` keeps ``seconds`` within the rules."""

    seconds: float = knob(gt=0)
    startup_steps_excluded: int = knob(ge=0)
    startup_allowance_cap_seconds: float = knob(ge=0)
    checkpoint_reserve_seconds: float = knob(ge=0, description="Kept free at the end for the final checkpoint.")
    competition: bool = knob(description="Enforce the competition's limits (seconds <= the phase's budget: 1800 in Phase 1, 14400 in Phase 2).")
    max_steps: int | None = knob(ge=1, description="Stop after this many steps even with budget left.")


class RuntimeSection(Section, spec=spec.RuntimeSpec):
    device: DeviceName = knob(description="auto: neuron, then cuda, then cpu.")
    dtype: Literal["auto", "float32", "bfloat16"] = knob(description="auto: bfloat16 where the device supports it.")
    compile: bool | Literal["auto"] = knob(
        description="torch.compile the training step and optimizer updates. auto: on for CPU and CUDA, "
        "off on Neuron (true compiles with the neuron backend); TRNF_COMPILE=0/1 overrides auto. "
        "The cache lives under the data home, so a second run starts warm.",
    )
    seed: int = knob(ge=0, le=MAX_SEED)
    nproc: int = knob(ge=1, le=128, description="Processes (torchrun --nproc_per_node; a Phase 2 server runs 64 or 128).")
    # An int in [1, 2], not Literal[1, 2]: a Literal accepts true as 1.
    lnc: int = knob(ge=1, le=2, description="NEURON_LOGICAL_NC_CONFIG on Neuron (1 or 2).")
    threads: int | None = knob(ge=1, description="CPU threads per process (default: torch's).")


class EvalSection(Section, spec=spec.EvalSpec):
    tokens: int = knob(ge=1, description="Validation tokens (2,097,152 public; ~20M official).")
    seq_len: int = knob(ge=8, description="Evaluation context (the contract's is 1024).")
    batch_size: int = knob(ge=1)
    every_seconds: float | None = knob(gt=0, description="Periodic validation during training.")
    final: bool = knob(description="Evaluate the final checkpoint with the trusted evaluate_bpb.")


class KernelsSection(Section, spec=spec.KernelsSpec):
    """Per kernel: off = plain PyTorch; auto = NKI on Neuron, reference elsewhere (said once);
    on = the NKI kernel is required, and its absence is an error."""

    @model_validator(mode="before")
    @classmethod
    def _yaml_booleans(cls, data: object) -> object:
        # YAML 1.1 reads a bare `on` / `off` as true / false; take them as the words meant.
        if isinstance(data, dict):
            return {k: ("on" if v is True else "off" if v is False else v) for k, v in data.items()}
        return data

    attention: KernelChoice = knob(
        description="Flash attention forward and backward kernels; unmeasured on hardware, "
        "so off by default until `trnf doctor --kernels` shows them faster than PyTorch.",
    )


class RunSection(Section, spec=spec.RunSpec):
    log_every_steps: int = knob(ge=1)
    checkpoint_every_seconds: float | None = knob(gt=0, description="Resumable checkpoints (None: final only).")
    max_loss: float = knob(gt=0, description="A loss above this (or NaN/inf) stops the run as diverged.")


class Recipe(Section):
    name: str = Field(..., min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    # An int within the contract's phases, not Literal[1, 2]: a Literal accepts true as 1.
    phase: int = Field(
        DEFAULT_PHASE,
        ge=min(PHASES),
        le=max(PHASES),
        description="The competition phase the run is for (contract/phases.py): 1, one chip for 30 minutes; "
        "2, a 16-chip trn2.48xlarge for 4 hours (budget.seconds defaults to 14400, package and verify "
        "check Phase 2's launch shapes and an inference.py).",
    )
    model: ModelSection = ModelSection()
    optim: OptimSection = OptimSection()
    schedule: ScheduleSection = ScheduleSection()
    data: DataSection = DataSection()
    budget: BudgetSection = BudgetSection()
    runtime: RuntimeSection = RuntimeSection()
    eval: EvalSection = EvalSection()
    kernels: KernelsSection = KernelsSection()
    run: RunSection = RunSection()

    @model_validator(mode="before")
    @classmethod
    def _phase_budget(cls, data: object) -> object:
        """A phase's budget is the default of ``budget.seconds`` (set it to run shorter)."""
        if not isinstance(data, dict) or data.get("phase", DEFAULT_PHASE) not in PHASES:
            return data
        budget = data.get("budget", {})
        if isinstance(budget, dict) and "seconds" not in budget and data.get("phase", DEFAULT_PHASE) != DEFAULT_PHASE:
            return {**data, "budget": {**budget, "seconds": PHASES[data["phase"]].budget_seconds}}
        return data

    @field_validator("budget", mode="after")
    @classmethod
    def _within_rules(cls, budget: BudgetSection, info: ValidationInfo) -> BudgetSection:
        # phase is declared before budget, so it is validated first (absent if it failed).
        limit = PHASES[info.data.get("phase", DEFAULT_PHASE)].budget_seconds
        if budget.competition and budget.seconds > limit:
            raise ValueError(
                f"seconds={budget.seconds:g} exceeds the competition budget of {limit:g} s "
                "(set budget.competition=false for a non-competition experiment)"
            )
        return budget

    @model_serializer(mode="wrap")
    def _without_phase_1(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Phase 1 is not written: its recipe.json, meta.json and train.py stay as they were."""
        data = handler(self)
        if data.get("phase") == DEFAULT_PHASE:
            del data["phase"]
        return data

    @model_validator(mode="after")
    def _batch_geometry(self) -> Recipe:
        self.grad_accum_steps()  # RecipeError (a ValueError) when the geometry does not divide
        return self

    def grad_accum_steps(self) -> int:
        """Micro-steps per optimizer step with ``runtime.nproc`` processes."""
        return grad_accum_steps(self.data.batch_size, self.model.sequence_len, self.runtime.nproc, self.data.total_batch_tokens)

    def resolved(self) -> ResolvedRecipe:
        """The typed resolved recipe the runtime trains from."""
        return ResolvedRecipe.from_dict(self.model_dump(mode="json"))
