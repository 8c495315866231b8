"""Stand-in for ``nki.language`` (as ``nl``): only what this repository's kernels use.

Math operators here are *tokens* passed to ``nki.isa`` instructions
(``nisa.activation(op=nl.exp, ...)``, ``nisa.tensor_tensor(op=nl.add, ...)``); calling
one directly on a tile (the ``nl.exp(tile)`` convenience form) is not modelled and
raises, so a kernel can't silently depend on something the interpreter does not check.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from . import machine
from .machine import (  # noqa: F401  (re-exported as nl.*)
    bfloat16,
    float16,
    float32,
    hbm,
    int32,
    private_hbm,
    psum,
    sbuf,
    shared_hbm,
    uint8,
)


class Op:
    """A math operator token with its NumPy meaning (float32 math, as the engines do).

    ``valid``: the Scalar Engine's documented valid input range (lo, hi) of the magnitude
    for activation functions that have one (nki.api.shared, "Supported Activation
    Functions"); ``scalar_fn`` applies it: out-of-range inputs give NaN, because the
    hardware gives invalid results there and a test must notice.
    """

    def __init__(
        self,
        name: str,
        fn: Callable[..., np.ndarray],
        arity: int,
        valid: tuple[float, float] | None = None,
    ) -> None:
        self.name, self.fn, self.arity, self.valid = name, fn, arity, valid

    def scalar_fn(self, x: np.ndarray) -> np.ndarray:
        """fn on the Scalar Engine: NaN where the input is outside the valid range."""
        x = _f(x)
        if self.valid is None:
            return self.fn(x)
        lo, hi = self.valid
        ok = (np.abs(x) >= lo) & (np.abs(x) <= hi) & (x > 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(ok, self.fn(np.where(ok, x, 1.0)), np.float32(np.nan)).astype(
                np.float32
            )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise machine.NkiInterpreterError(
            f"nl.{self.name}(...) called on tiles: the interpreter models it only as an operator "
            "token for nki.isa instructions"
        )

    def __repr__(self) -> str:
        return f"nl.{self.name}"


def _f(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


# unary: activation functions (Scalar Engine)
copy = Op("copy", lambda x: _f(x), 1)
exp = Op("exp", lambda x: np.exp(_f(x)), 1)
log = Op("log", lambda x: np.log(_f(x)), 1, valid=(2.0**-64, 2.0**64))
tanh = Op("tanh", lambda x: np.tanh(_f(x)), 1)
square = Op("square", lambda x: _f(x) * _f(x), 1)
sqrt = Op("sqrt", lambda x: np.sqrt(_f(x)), 1, valid=(2.0**-116, 2.0**118))
rsqrt = Op("rsqrt", lambda x: 1.0 / np.sqrt(_f(x)), 1, valid=(2.0**-87, 2.0**97))
relu = Op("relu", lambda x: np.maximum(_f(x), 0.0), 1)

# binary: arithmetic and comparison operators (Vector Engine)
add = Op("add", lambda a, b: _f(a) + _f(b), 2)
subtract = Op("subtract", lambda a, b: _f(a) - _f(b), 2)
multiply = Op("multiply", lambda a, b: _f(a) * _f(b), 2)
divide = Op("divide", lambda a, b: _f(a) / _f(b), 2)
maximum = Op("maximum", lambda a, b: np.maximum(_f(a), _f(b)), 2)
minimum = Op("minimum", lambda a, b: np.minimum(_f(a), _f(b)), 2)
equal = Op("equal", lambda a, b: (_f(a) == _f(b)).astype(np.float32), 2)
greater_equal = Op("greater_equal", lambda a, b: (_f(a) >= _f(b)).astype(np.float32), 2)

UNARY = {op.name: op for op in (copy, exp, log, tanh, square, sqrt, rsqrt, relu)}
# nki.language tile functions that are not operators of the engines' ALU (NKI ISA
# "Supported Math Operators"): refused as an instruction's op, with what to do instead
NOT_ALU = {"divide": "multiply by the nisa.reciprocal of the divisor instead"}
BINARY = {
    op.name: op for op in (add, subtract, multiply, divide, maximum, minimum, equal, greater_equal)
}


class _TileSize:
    pmax = machine.PMAX
    psum_fmax = machine.PSUM_BANK_BYTES_PER_PARTITION // 4
    gemm_stationary_fmax = machine.MATMUL_STATIONARY_FMAX
    gemm_moving_fmax = machine.MATMUL_MOVING_FMAX


tile_size = _TileSize()


def ndarray(
    shape: tuple[int, ...], dtype: machine.DType, buffer: machine.Buffer = sbuf, name: str = ""
) -> machine.Tensor:
    """Allocate a tensor; on-chip ones are checked against the partition and capacity limits."""
    if not isinstance(dtype, machine.DType):
        raise machine.NkiInterpreterError(f"nl.ndarray: dtype must be an nl dtype, got {dtype!r}")
    if not isinstance(buffer, machine.Buffer):
        raise machine.NkiInterpreterError(
            f"nl.ndarray: buffer must be an nl buffer (nl.sbuf, ...), got {buffer!r}"
        )
    shape = tuple(int(s) for s in shape)
    caller = sys._getframe(1)
    site = f"{caller.f_code.co_filename}:{caller.f_lineno}"
    allocator = machine.STATE.allocator
    if allocator is None:
        raise machine.NkiInterpreterError("nl.ndarray called outside a kernel run")
    tensor = machine.Tensor(shape, dtype, buffer, name=name or site.rsplit("/", 1)[-1])
    allocator.allocate(tensor, site)
    return tensor


def affine_range(*args: int) -> range:
    """NKI 0.3+: an alias of ``range`` (iterations run in order; values may be carried)."""
    return range(*args)


def sequential_range(*args: int) -> range:
    """NKI 0.3+: an alias of ``range``."""
    return range(*args)


def static_range(*args: int) -> range:
    """NKI 0.3+: an alias of ``range`` (unrolled at specialization)."""
    return range(*args)


def dynamic_range(*args: int) -> range:
    """NKI 0.6: a loop the compiler keeps as a loop (not unrolled); removed in NKI 0.7."""
    version = machine.STATE.version
    if version is not None and not version.dynamic_range:
        raise machine.NkiInterpreterError(
            f"nl.dynamic_range does not exist in NKI {version.name} (removed in 0.7); "
            "use nl.affine_range / nl.sequential_range"
        )
    return range(*args)


def program_id(axis: int = 0) -> int:
    """Which program of the launch grid this is (0 without a grid)."""
    if axis != 0:
        raise machine.NkiInterpreterError("only a 1-D launch grid (the LNC degree) is modelled")
    return machine.STATE.program_id


def num_programs(axis: int = 0) -> int:
    """How many programs the launch grid has (1 without a grid)."""
    if axis != 0:
        raise machine.NkiInterpreterError("only a 1-D launch grid (the LNC degree) is modelled")
    return machine.STATE.num_programs


def ds(start: int, size: int) -> slice:
    """A dynamic slice ``start:start+size`` (all sizes are concrete in the interpreter)."""
    return slice(int(start), int(start) + int(size))
