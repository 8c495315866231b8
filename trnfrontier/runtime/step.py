"""One optimizer step: the only copy of it, taken by the trainer and timed by the profiler.

A step is ``accum`` micro-batches of forward and backward (under DDP the gradients are
all-reduced on the last one only), a read of the loss (a host sync every step pays: the
trainer checks it for divergence before any update), gradient clipping and the
optimizers' update. Callers see into it through hooks:

- ``phase(name)``: a context manager around each part ("data", "forward", "backward",
  "communication", "optimizer"); the profiler's PhaseTimer, a no-op for the trainer;
- ``accept(loss) -> bool``: asked before the update; False leaves the weights as they
  were (the trainer's divergence check, OR-ed over ranks).

Runtime layer: standard library and torch only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from trnfrontier.runtime import compiling, devices, distributed
from trnfrontier.runtime.model import GPT
from trnfrontier.runtime.optim import clip_grad_norm
from trnfrontier.runtime.sharded_optim import ShardedUpdate

PhaseHook = Callable[[str], AbstractContextManager[None]]
# next_batch(micro) -> (inputs, targets, data-stream state after it, or None)
BatchSource = Callable[[int], tuple[torch.Tensor, torch.Tensor, Any]]


@contextlib.contextmanager
def no_phase(name: str) -> Iterator[None]:
    yield


class TrainLoss(nn.Module):
    """``forward(x, y) -> loss`` around the model, so that DDP (and torch.compile) see the
    training loss as the module's forward: DDP's gradient hooks are armed in forward()."""

    def __init__(self, model: GPT) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.model.loss(x, y)


def step_module(
    model: GPT,
    device: torch.device,
    info: distributed.DistInfo,
    compile_model: bool,
    *,
    sharded: bool = False,
) -> tuple[nn.Module, nn.Module | None]:
    """The module a step calls (the training loss; DDP-wrapped when distributed and the
    optimizer is not ``sharded``, which reduces the gradients itself; then compiled when
    asked) and the DDP wrapper itself (None in one process or when sharded)."""
    module: nn.Module = TrainLoss(model)
    ddp: nn.Module | None = None
    if info.is_distributed and not sharded:
        module = ddp = distributed.wrap(module, device, info)
    if compile_model:
        module = compiling.compile_module(module, device.type)
    return module, ddp


@dataclass(frozen=True)
class StepResult:
    loss: float  # this rank's mean loss over the step's micro-batches
    data_state: list[Any]  # each data stream's state after its last micro-batch of the step
    applied: bool  # False: ``accept`` refused the update, the weights are unchanged


@dataclass
class TrainStep:
    """What a step needs, built once by the caller."""

    model: GPT
    optimizers: list[torch.optim.Optimizer]
    module: nn.Module  # from step_module(): forward(x, y) -> loss
    ddp: nn.Module | None
    device: torch.device
    dtype: torch.dtype
    accum: int
    grad_clip: float
    streams: int = 1  # data streams; micro-step m reads stream m % streams
    # Data parallel with the optimizer split across ranks (sharded_optim): it reduces the
    # gradients, clips and updates in one call, in place of DDP's all-reduce and step().
    sharded: ShardedUpdate | None = None

    def zero_grads(self) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)

    def take(
        self,
        next_batch: BatchSource,
        *,
        phase: PhaseHook = no_phase,
        accept: Callable[[float], bool] | None = None,
    ) -> StepResult:
        """Run one step; see the module docstring for the hooks."""
        loss_sum, data_state = self._accumulate(next_batch, phase)
        with phase("communication"):
            pass  # under DDP the all-reduce runs inside the last backward; named for the profile
        with phase("optimizer"):
            loss = float(loss_sum.item()) / self.accum
            applied = accept is None or accept(loss)
            if applied and self.sharded is not None:
                self.sharded.step(self.grad_clip)  # its collectives are timed here
            elif applied:
                clip_grad_norm(self.model.parameters(), self.grad_clip)
                for opt in self.optimizers:
                    opt.step()
        self.zero_grads()
        return StepResult(loss, data_state, applied)

    def _accumulate(self, next_batch: BatchSource, phase: PhaseHook) -> tuple[torch.Tensor, list[Any]]:
        loss_sum = torch.zeros((), device=self.device)
        # Every stream is read at least once a step (accum >= streams), so each slot
        # holds that stream's state after its last micro-batch of this step.
        data_state: list[Any] = [None] * self.streams
        for micro in range(self.accum):
            with phase("data"):
                x, y, data_state[micro % self.streams] = next_batch(micro)
            last = self.ddp is None or micro == self.accum - 1
            # DDP all-reduces on the last micro-step only.
            with contextlib.nullcontext() if last or self.ddp is None else self.ddp.no_sync():
                with phase("forward"), devices.autocast(self.device, self.dtype):
                    loss = self.module(x, y)
                with phase("backward"):
                    (loss / self.accum).backward()
                    loss_sum += loss.detach().float()
        return loss_sum, data_state
