"""A small NumPy interpreter for this repository's NKI kernels (see kernels/README.md).

from kernels.testing import load_kernel_module
relu2 = load_kernel_module("relu2")
y = relu2.relu2_fwd(x)          # x: a NumPy array -> y: a NumPy array
"""

from .budget import Budget
from .interpreter import ArgSpec, HostTensor, InterpretedKernel, bf16, load_kernel_module, spec
from .machine import (
    GridCoverageError,
    NkiInterpreterError,
    NkiLimitError,
    PsumAccumulateError,
    UninitializedReadError,
    round_bf16,
)
from .subset import NkiSubsetError

__all__ = [
    "ArgSpec",
    "Budget",
    "GridCoverageError",
    "HostTensor",
    "InterpretedKernel",
    "NkiInterpreterError",
    "NkiLimitError",
    "NkiSubsetError",
    "PsumAccumulateError",
    "UninitializedReadError",
    "bf16",
    "load_kernel_module",
    "round_bf16",
    "spec",
]
