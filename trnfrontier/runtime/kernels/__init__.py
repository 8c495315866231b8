"""NKI kernel dispatch: ``trnf::*`` custom ops, their references, and recipe-driven selection.

    from trnfrontier.runtime.kernels import use_kernels
    chosen = use_kernels(cfg["kernels"], device)   # {"relu2": "nki" | "reference", ...}

See kernels/README.md for the kernels themselves and how they are tested.
"""

from .backend import (
    KERNEL_NAMES,
    KernelFallbackWarning,
    KernelUnavailableError,
    kernel_backend,
)
from .select import register_ops, reset_kernels, use_kernels

__all__ = [
    "KERNEL_NAMES",
    "KernelFallbackWarning",
    "KernelUnavailableError",
    "kernel_backend",
    "register_ops",
    "reset_kernels",
    "use_kernels",
]
