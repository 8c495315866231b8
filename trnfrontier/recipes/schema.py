"""The recipe schema: every knob of a training run, validated before any compute is spent.

``Recipe.model_dump(mode="json")`` is the *resolved recipe*: plain data that the runtime
layer (and a packaged train.py, which has no pydantic) reads key by key. Field names
here are therefore a contract with ``trnfrontier.runtime``; rename nothing lightly.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from trnfrontier.runtime.budget_rule import (
    BUDGET_SECONDS,
    STARTUP_CAP_SECONDS,
    STARTUP_STEPS_EXCLUDED,
)
from trnfrontier.runtime.recipe import ModelSpec, ResolvedRecipe, grad_accum_steps, model_shape

COMPETITION_BUDGET_SECONDS = BUDGET_SECONDS
# Seeds feed torch.manual_seed, numpy and random: a non-negative 64-bit signed integer
# is what all three take without overflow.
MAX_SEED = 2**63 - 1


class Section(BaseModel):
    # strict: YAML already types every scalar, so a string where a number belongs
    # (`depth: '10'`) or a bool where a float belongs (`matrix_lr: yes`, which YAML 1.1
    # reads as true) is a mistake to report, not a value to coerce. allow_inf_nan=False:
    # no knob of a run means anything at infinity (`rope_base: .inf`, `grad_clip: .inf`).
    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True, allow_inf_nan=False)


# The model's defaults are the runtime's (runtime/recipe.py ModelSpec), which builds a
# model from a partial section too.
_MODEL = ModelSpec()


class ModelSection(Section):
    """A nanochat-style GPT. Width comes from depth x aspect_ratio (rounded up to a whole
    number of heads) unless ``n_embd`` is given."""

    depth: int = Field(_MODEL.depth, ge=1, le=128, description="Transformer blocks.")
    aspect_ratio: int = Field(_MODEL.aspect_ratio, ge=1, description="Width per layer of depth when n_embd is not given.")
    head_dim: int = Field(_MODEL.head_dim, ge=8, le=256, description="Channels per attention head (even, for rotary).")
    n_embd: int | None = Field(None, ge=8, description="Explicit width; overrides depth x aspect_ratio.")
    n_head: int | None = Field(None, ge=1, description="Query heads; default n_embd // head_dim.")
    n_kv_head: int | None = Field(None, ge=1, description="Key/value heads (GQA when < n_head); default n_head.")
    mlp_ratio: int = Field(_MODEL.mlp_ratio, ge=1, le=16)
    vocab_size: int = Field(_MODEL.vocab_size, ge=256, description="Must equal the tokenizer's vocabulary.")
    sequence_len: int = Field(_MODEL.sequence_len, ge=8, le=65536, description="Training context length.")
    softcap: float = Field(_MODEL.softcap, ge=0.0, description="Logit softcap (0 disables).")
    value_embeds: bool = Field(_MODEL.value_embeds, description="Value embeddings mixed into attention values.")
    rope_base: float = Field(_MODEL.rope_base, gt=0)

    @model_validator(mode="after")
    def _shapes(self) -> ModelSection:
        self.shape()  # RecipeError is a ValueError: pydantic reports it on this section
        return self

    def shape(self) -> tuple[int, int, int]:
        """(n_embd, n_head, n_kv_head), derived as the runtime derives them."""
        return model_shape(self.depth, self.aspect_ratio, self.head_dim, self.n_embd, self.n_head, self.n_kv_head)

    def resolved_n_embd(self) -> int:
        return self.shape()[0]


class OptimSection(Section):
    """Muon (Polar Express) for the blocks' matrices; AdamW for embeddings, head and scalars."""

    matrix_lr: float = Field(0.02, gt=0, description="Muon learning rate for 2-D block weights.")
    embedding_lr: float = Field(0.2, gt=0, description="AdamW LR for token (and value) embeddings.")
    unembedding_lr: float = Field(0.004, gt=0, description="AdamW LR for the output head.")
    scalar_lr: float = Field(0.5, gt=0, description="AdamW LR for scalar / vector parameters.")
    lr_width_scaling: bool = Field(True, description="Scale AdamW LRs by (n_embd/768)^-0.5 as nanochat does.")
    lr_batch_scaling: bool = Field(
        True,
        description="Scale every LR by sqrt(tokens per step / reference_batch_tokens), nanochat's rule: "
        "the LRs above are tuned at the reference batch, and a smaller batch (noisier gradients) takes "
        "proportionally smaller steps (1/8 of them at 8,192 tokens).",
    )
    reference_batch_tokens: int = Field(
        524_288, ge=1, description="Tokens per step at which the LRs above apply unscaled (nanochat: 2^19)."
    )
    adam_betas: tuple[float, float] = (0.8, 0.95)
    adam_eps: float = Field(1e-10, gt=0)
    weight_decay: float = Field(0.0, ge=0, description="Muon weight decay.")
    cautious_weight_decay: bool = Field(False, description="Decay only where update and weight agree in sign.")
    muon_momentum: float = Field(0.95, ge=0, lt=1)
    muon_momentum_warmup_start: float = Field(0.85, ge=0, lt=1)
    muon_momentum_warmup_steps: int = Field(300, ge=0)
    nesterov: bool = True
    polar_express_steps: int = Field(5, ge=1, le=5)
    normuon: bool = Field(False, description="NorMuon: per-neuron second-moment normalisation of the update.")
    normuon_beta2: float = Field(0.95, ge=0, lt=1)
    grad_clip: float = Field(0.0, ge=0, description="Global grad-norm clip (0 disables).")

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


class ScheduleSection(Section):
    """LR multiplier over the run: warmup, flat, warmdown to final_lr_frac.

    ``mode: time`` drives it by the fraction of the training budget charged so far, so a
    slower step never leaves the run stuck at a high LR when time runs out; ``mode: steps``
    uses ``total_steps`` for fixed-step experiments.
    """

    mode: Literal["time", "steps"] = "time"
    warmup_frac: float = Field(0.0, ge=0, le=1)
    warmup_steps: int = Field(
        0, ge=0, description="Linear LR warm-up over the first N optimizer steps (nanochat: 40), with warmup_frac: the smaller ramp applies."
    )
    warmdown_frac: float = Field(0.4, ge=0, le=1)
    final_lr_frac: float = Field(0.0, ge=0, le=1)
    total_steps: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _consistent(self) -> ScheduleSection:
        if self.warmup_frac + self.warmdown_frac > 1.0:
            raise ValueError("warmup_frac + warmdown_frac must be <= 1")
        if self.mode == "steps" and self.total_steps is None:
            raise ValueError("mode 'steps' needs total_steps")
        return self


class DataSection(Section):
    dataset: str | None = Field(None, description="Prepared dataset name (default: the active one).")
    batch_size: int = Field(32, ge=1, description="Rows per device per micro-step.")
    total_batch_tokens: int | None = Field(
        None, ge=1, description="Tokens per optimizer step over all ranks; default one micro-step on every rank."
    )


class BudgetSection(Section):
    """The organisers' clock. ``competition: true`` keeps ``seconds`` within the rules."""

    seconds: float = Field(COMPETITION_BUDGET_SECONDS, gt=0)
    startup_steps_excluded: int = Field(STARTUP_STEPS_EXCLUDED, ge=0)
    startup_allowance_cap_seconds: float = Field(STARTUP_CAP_SECONDS, ge=0)
    checkpoint_reserve_seconds: float = Field(30.0, ge=0, description="Kept free at the end for the final checkpoint.")
    competition: bool = Field(True, description="Enforce the competition's limits (seconds <= 1800).")
    max_steps: int | None = Field(None, ge=1, description="Stop after this many steps even with budget left.")

    @model_validator(mode="after")
    def _within_rules(self) -> BudgetSection:
        if self.competition and self.seconds > COMPETITION_BUDGET_SECONDS:
            raise ValueError(
                f"seconds={self.seconds:g} exceeds the competition budget of {COMPETITION_BUDGET_SECONDS:g} s "
                "(set budget.competition=false for a non-competition experiment)"
            )
        return self


class RuntimeSection(Section):
    device: Literal["auto", "cpu", "cuda", "neuron"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16"] = Field("auto", description="auto: bfloat16 where the device supports it.")
    compile: bool | Literal["auto"] = Field(
        "auto",
        description="torch.compile the training step and optimizer updates. auto: on for CPU and CUDA, "
        "off on Neuron (true compiles with the neuron backend); TRNF_COMPILE=0/1 overrides auto. "
        "The cache lives under the data home, so a second run starts warm.",
    )
    seed: int = Field(1337, ge=0, le=MAX_SEED)
    nproc: int = Field(1, ge=1, le=64, description="Processes (torchrun --nproc_per_node).")
    # An int in [1, 2], not Literal[1, 2]: a Literal accepts true as 1.
    lnc: int = Field(2, ge=1, le=2, description="NEURON_LOGICAL_NC_CONFIG on Neuron (1 or 2).")
    threads: int | None = Field(None, ge=1, description="CPU threads per process (default: torch's).")


class EvalSection(Section):
    tokens: int = Field(2_097_152, ge=1, description="Validation tokens (2,097,152 public; ~20M official).")
    seq_len: int = Field(1024, ge=8, description="Evaluation context (the contract's is 1024).")
    batch_size: int = Field(8, ge=1)
    every_seconds: float | None = Field(None, gt=0, description="Periodic validation during training.")
    final: bool = Field(True, description="Evaluate the final checkpoint with the trusted evaluate_bpb.")


KernelChoice = Literal["off", "auto", "on"]


class KernelsSection(Section):
    """Per kernel: off = plain PyTorch; auto = NKI on Neuron, reference elsewhere (said once);
    on = the NKI kernel is required, and its absence is an error."""

    @model_validator(mode="before")
    @classmethod
    def _yaml_booleans(cls, data: object) -> object:
        # YAML 1.1 reads a bare `on` / `off` as true / false; take them as the words meant.
        if isinstance(data, dict):
            return {k: ("on" if v is True else "off" if v is False else v) for k, v in data.items()}
        return data

    relu2: KernelChoice = "off"
    rmsnorm: KernelChoice = "off"
    rope_qknorm: KernelChoice = "off"
    cross_entropy: KernelChoice = "off"
    polar_express: KernelChoice = "off"
    # off until a Trn2 measures the kernels faster than PyTorch (kernels/README.md)
    attention: KernelChoice = Field(
        "off",
        description="Flash attention forward and backward kernels; unmeasured on hardware, "
        "so off by default until `trnf doctor --kernels` shows them faster than PyTorch.",
    )


class RunSection(Section):
    log_every_steps: int = Field(1, ge=1)
    checkpoint_every_seconds: float | None = Field(300.0, gt=0, description="Resumable checkpoints (None: final only).")
    max_loss: float = Field(20.0, gt=0, description="A loss above this (or NaN/inf) stops the run as diverged.")


class Recipe(Section):
    name: str = Field(..., min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    model: ModelSection = ModelSection()
    optim: OptimSection = OptimSection()
    schedule: ScheduleSection = ScheduleSection()
    data: DataSection = DataSection()
    budget: BudgetSection = BudgetSection()
    runtime: RuntimeSection = RuntimeSection()
    eval: EvalSection = EvalSection()
    kernels: KernelsSection = KernelsSection()
    run: RunSection = RunSection()

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
