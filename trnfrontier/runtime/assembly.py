"""The one builder of a training step from a resolved recipe: model, optimizers, compiled
``TrainStep`` and the tokens-per-step arithmetic, for the trainer, ``trnf profile`` and
the benchmarks alike, so that what is profiled and benchmarked is what trains.

Two calls, because a resumed run loads its checkpoint between them (before the step is
compiled and the data-parallel update cuts the optimizer state down to a rank's share):

    parts = build_parts(recipe, spec, info)   # seed, kernels, model, optimizers, batch geometry
    ...                                       # a resume loads into parts.model / parts.optimizers
    step = build_step(parts)                  # compile, the data-parallel update, TrainStep

Runtime layer: standard library, torch and numpy only (a submission carries it).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

import numpy as np
import torch

from trnfrontier.runtime import compiling, devices, distributed
from trnfrontier.runtime.model import GPT, GPTConfig
from trnfrontier.runtime.optim import apply_schedule, batch_lr_scale, build_optimizers
from trnfrontier.runtime.recipe import KernelsSpec, ResolvedRecipe
from trnfrontier.runtime.schedule import lr_multiplier, muon_momentum, step_warmup
from trnfrontier.runtime.sharded_optim import ShardedUpdate, resolve_sharded
from trnfrontier.runtime.step import TrainStep, step_module


@dataclass(frozen=True)
class BatchGeometry:
    """How one optimizer step's tokens are cut: ``accum`` micro-batches of
    ``batch_size`` x ``seq_len`` on each of ``world_size`` ranks."""

    batch_size: int
    seq_len: int
    world_size: int
    accum: int

    @property
    def rank_tokens(self) -> int:
        """Tokens one rank processes per optimizer step."""
        return self.batch_size * self.seq_len * self.accum

    @property
    def tokens(self) -> int:
        """Tokens of one optimizer step over all ranks (what the LRs follow)."""
        return self.rank_tokens * self.world_size


def batch_geometry(recipe: ResolvedRecipe, world_size: int) -> BatchGeometry:
    """The recipe's batch over ``world_size`` ranks; RecipeError when
    ``data.total_batch_tokens`` does not divide into whole micro-batches."""
    return BatchGeometry(
        recipe.data.batch_size, recipe.model.sequence_len, world_size, recipe.grad_accum_steps(world_size)
    )


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def choose_kernels(kernels: KernelsSpec, device: torch.device) -> dict[str, str]:
    """``use_kernels`` for a recipe that turns a kernel on; plain PyTorch otherwise.

    The kernel dispatch package is imported only when a kernel is wanted, so a run (and a
    single-file train.py, which inlines only what it imports) without kernels never needs it.
    The choice is process-wide (the ops dispatch table), like the model's code.
    """
    choices = dataclasses.asdict(kernels)
    if all(choice == "off" for choice in choices.values()):
        return {name: "reference" for name in choices}
    from trnfrontier.runtime.kernels import use_kernels

    return use_kernels(choices, device)


@dataclass
class Parts:
    """A recipe's model and optimizers on a device, before the step is built."""

    recipe: ResolvedRecipe
    spec: devices.DeviceSpec
    info: distributed.DistInfo
    geometry: BatchGeometry
    kernels: dict[str, str]  # kernel -> "nki" | "reference"
    model: GPT
    optimizers: list[torch.optim.Optimizer]

    @property
    def matrix_lr(self) -> float:
        """Muon's LR before the schedule (the recipe's, batch-scaled), for logs."""
        return self.recipe.optim.matrix_lr * batch_lr_scale(self.geometry.tokens, self.recipe.optim)

    def schedule(self, step: int, progress: float) -> float:
        """Set the LRs and Muon's momentum for optimizer step ``step`` (0-based) at
        ``progress`` (0 to 1) through the run; returns the LR multiplier."""
        s, o = self.recipe.schedule, self.recipe.optim
        lrm = min(
            lr_multiplier(progress, s.warmup_frac, s.warmdown_frac, s.final_lr_frac),
            step_warmup(step, s.warmup_steps),
        )
        momentum = muon_momentum(step, o.muon_momentum_warmup_start, o.muon_momentum, o.muon_momentum_warmup_steps)
        apply_schedule(self.optimizers, lrm, momentum)
        return lrm


def build_parts(
    recipe: ResolvedRecipe,
    spec: devices.DeviceSpec,
    info: distributed.DistInfo,
    *,
    world_size: int | None = None,
) -> Parts:
    """Seed, choose the kernels, build the model on ``spec.device`` and its optimizers.

    ``world_size``: the ranks the step's batch is cut over (default: ``info``'s); the
    profiler times one rank of a ``runtime.nproc`` run in one process. Kernels are chosen
    before the model is built, so every op it calls is the recipe's choice
    (KernelUnavailableError: a kernel set to "on" that cannot run here). A run that will
    compile gets its compile cache under the data home first (``$TRNF_HOME/compile``)."""
    if compiling.compile_enabled(recipe.runtime.compile, spec.device.type):
        # First: building the model imports torch._dynamo, which fills TORCHINDUCTOR_CACHE_DIR
        # with torch's /tmp default, and use_cache_under_home only fills an unset variable.
        compiling.use_cache_under_home()
    geometry = batch_geometry(recipe, world_size or info.world_size)
    seed_everything(recipe.runtime.seed)
    kernels = choose_kernels(recipe.kernels, spec.device)
    # Initialised on the CPU from the seed, then moved: the same weights on every device.
    model = GPT(GPTConfig.from_recipe(recipe.model)).to(spec.device)
    # LRs follow the batch (optim.lr_batch_scaling): the tokens of one optimizer step.
    optimizers = build_optimizers(model, recipe.optim, geometry.tokens)
    return Parts(recipe, spec, info, geometry, kernels, model, optimizers)


@dataclass
class BuiltStep:
    """The step of a run, ready to take: ``stepper.take(next_batch)``."""

    stepper: TrainStep
    compiled: bool  # runtime.compile decided for this device
    sharded: ShardedUpdate | None  # the optimizer split across ranks (optim.sharded)


def build_step(parts: Parts) -> BuiltStep:
    """Compile (runtime.compile: the loss module and the optimizers' updates), choose the
    data-parallel update and wrap the step, after any checkpoint has been loaded into
    ``parts``. The compile time lands in the first (uncharged) startup steps; the cache is
    under the data home (build_parts put it there) so the next run starts warm."""
    device, r = parts.spec.device, parts.recipe
    compiled = compiling.compile_enabled(r.runtime.compile, device.type)
    if compiled:
        compiling.compile_optimizers(parts.optimizers, device.type)
    sharded = data_parallel_update(parts)
    module, ddp = step_module(parts.model, device, parts.info, compiled, sharded=sharded is not None)
    stepper = TrainStep(
        parts.model,
        parts.optimizers,
        module,
        ddp,
        device,
        parts.spec.dtype,
        parts.geometry.accum,
        r.optim.grad_clip,
        sharded=sharded,
    )
    return BuiltStep(stepper, compiled, sharded)


def data_parallel_update(parts: Parts) -> ShardedUpdate | None:
    """The optimizer's form when several ranks train (None: each rank steps the whole
    optimizers, DDP having all-reduced the gradients). optim.sharded: each rank updates
    its share and keeps only that share's state; built after a resume, it cuts the loaded
    state down to this rank's share."""
    r = parts.recipe
    if resolve_sharded(r.optim.sharded, parts.info.world_size, r.optim.grad_clip):
        return ShardedUpdate(parts.optimizers)
    return None
