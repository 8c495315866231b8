"""Interpreted kernels callable with torch tensors, as the ``trnf::`` ops call real ones.

``TorchAdapter(load_kernel_module(name))`` stands in for a kernel module loaded with the
real ``nki``: ``adapter.relu2_fwd[2](x_torch)`` runs the kernel under the interpreter on
an LNC=2 grid and returns torch tensors. Tests and ``trnf doctor --kernels`` (on a machine
without Neuron) route the ops' NKI path through it with ``backend.kernel_backend``.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
import torch

from . import machine
from .interpreter import HostTensor, InterpretedKernel, load_kernel_module

_TORCH_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int32": torch.int32,
}


def to_host(arg: Any) -> Any:
    """A torch tensor as the interpreter's kernel argument (others unchanged)."""
    if not isinstance(arg, torch.Tensor):
        return arg
    t = arg.detach().cpu()
    if t.dtype == torch.bfloat16:
        return HostTensor(t.float().numpy(), machine.bfloat16)
    if t.dtype == torch.float64:
        raise TypeError("the kernels take float32/bfloat16/float16, not float64")
    return t.numpy()


class TorchKernel:
    """An interpreted kernel callable with torch tensors; ``[grid]`` launches it on a grid."""

    def __init__(self, fn: InterpretedKernel) -> None:
        self.fn = fn

    def __getitem__(self, grid: int) -> TorchKernel:
        return TorchKernel(self.fn[grid])

    def __call__(self, *args: Any) -> Any:
        result = self.fn.run_typed(*[to_host(a) for a in args])
        pairs = result if isinstance(result[0], tuple) else (result,)
        out = tuple(
            torch.from_numpy(np.ascontiguousarray(v)).to(_TORCH_DTYPES[d.name]) for v, d in pairs
        )
        return out if isinstance(result[0], tuple) else out[0]


class TorchAdapter:
    """Kernel functions of an interpreted module, callable with torch tensors."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module

    def __getattr__(self, attr: str) -> Any:
        fn = getattr(self.module, attr)
        return TorchKernel(fn) if isinstance(fn, InterpretedKernel) else fn


def interpreted_torch_module(name: str) -> TorchAdapter:
    """``kernels/<name>.py`` under the interpreter, callable with torch tensors."""
    return TorchAdapter(load_kernel_module(name))
