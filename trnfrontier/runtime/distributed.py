"""torch.distributed from the torchrun environment: init, DDP, rank-0 duties, collectives.

Single-process runs (no ``RANK``/``WORLD_SIZE`` in the environment) never initialise a
process group, and every helper here is then a cheap no-op. Backends: gloo on CPU, nccl
on CUDA, ``neuron`` (registered by torch_neuronx) on Neuron.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn

from trnfrontier.runtime.exit_settle import SETTLE_SECONDS

BACKENDS = {"cpu": "gloo", "cuda": "nccl", "neuron": "neuron"}
# Long enough for a first Neuron compilation on one rank while the others wait.
INIT_TIMEOUT = timedelta(minutes=60)


@dataclass(frozen=True)
class DistInfo:
    is_distributed: bool
    rank: int
    local_rank: int
    world_size: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def dist_info() -> DistInfo:
    """Rank and world size as torchrun sets them (the same rule as prepare.get_dist_info)."""
    if all(key in os.environ for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE")):
        world = int(os.environ["WORLD_SIZE"])
        return DistInfo(world > 1, int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), world)
    return DistInfo(False, 0, 0, 1)


def backend_for(device_type: str) -> str:
    try:
        return BACKENDS[device_type]
    except KeyError:
        raise ValueError(
            f"no torch.distributed backend known for device type {device_type!r}"
        ) from None


def init(device: torch.device, info: DistInfo) -> None:
    """Join the process group (once; a no-op for a single process)."""
    if not info.is_distributed or dist.is_initialized():
        return
    kwargs = {}
    if device.type == "cuda":
        kwargs["device_id"] = device  # binds NCCL to this rank's GPU (no guessing)
    dist.init_process_group(backend=backend_for(device.type), timeout=INIT_TIMEOUT, **kwargs)


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        if dist.get_backend() == "gloo":
            # Before the group goes, so gloo's worker frees its last work (exit_settle).
            time.sleep(SETTLE_SECONDS)
        dist.destroy_process_group()


def wrap(module: nn.Module, device: torch.device, info: DistInfo) -> nn.Module:
    """DDP over ``module`` when distributed (gradients all-reduced, averaged), else as is."""
    if not info.is_distributed:
        return module
    device_ids = [device.index] if device.type == "cuda" and device.index is not None else None
    return nn.parallel.DistributedDataParallel(
        module, device_ids=device_ids, broadcast_buffers=False
    )


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def barrier() -> None:
    if active():
        dist.barrier()


def any_true(flags: list[bool], device: torch.device) -> list[bool]:
    """Element-wise OR over all ranks: every rank takes the same decisions (stop, diverged,
    evaluate, checkpoint) from one small all-reduce, so none waits on a collective alone."""
    if not active():
        return list(flags)
    t = torch.tensor([1.0 if f else 0.0 for f in flags], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [bool(v) for v in t.tolist()]


def mean(value: float, device: torch.device) -> float:
    """The mean of a float over ranks (for logging a global loss)."""
    if not active():
        return value
    t = torch.tensor(
        [value], dtype=torch.float64 if device.type == "cpu" else torch.float32, device=device
    )
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t.item()) / dist.get_world_size()


def gather_objects(obj: object) -> list[object]:
    """Every rank's ``obj`` on every rank (small JSON-able state for checkpoints)."""
    if not active():
        return [obj]
    out: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
