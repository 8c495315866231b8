"""A small NumPy interpreter for this repository's NKI kernels (see kernels/README.md).

from kernels.testing import load_kernel_module
relu2 = load_kernel_module("relu2")
y = relu2.relu2_fwd(x)          # x: a NumPy array -> y: a NumPy array
"""

from .interpreter import HostTensor, InterpretedKernel, bf16, load_kernel_module
from .machine import (
    LoopDependencyError,
    NkiInterpreterError,
    NkiLimitError,
    UninitializedReadError,
    round_bf16,
)

__all__ = [
    "HostTensor",
    "InterpretedKernel",
    "LoopDependencyError",
    "NkiInterpreterError",
    "NkiLimitError",
    "UninitializedReadError",
    "bf16",
    "load_kernel_module",
    "round_bf16",
]
