"""Stand-in for ``nki.isa`` (as ``nisa``): the instructions this repository's kernels use.

Each function follows the documented NKI 0.6 signature (``dst`` first, keyword names as
documented) and semantics, computes in float32 as the engines do, casts the result to
``dst``'s dtype, and checks the documented operand rules: which memories an instruction
may read and write, partition sizes, matmul tile limits, the ALU operator table, and the
rules that differ by NKI version (``machine.STATE.version``). Anything else raises.

Every instruction is issued through :func:`_issue`: it advances the clock that measures
tile lifetimes, records the instruction in the program's budget (budget.py) and, when
the kernel is only being traced for its budget, returns True so the math is skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import language as nl
from . import machine
from .machine import (
    MATMUL_MOVING_FMAX,
    MATMUL_STATIONARY_FMAX,
    PMAX,
    NkiInterpreterError,
    NkiLimitError,
    PsumAccumulateError,
    View,
    as_view,
    float32,
    psum,
    sbuf,
)


class reduce_cmd:  # noqa: N801  (mirrors nisa.reduce_cmd)
    idle = "idle"
    reset_reduce = "reset_reduce"


def _on_chip(obj: Any, what: str) -> View:
    view = as_view(obj, what)
    if not view.buffer.on_chip:
        raise NkiInterpreterError(
            f"{what}: operand {view!r} is in {view.buffer!r}; compute engines read SBUF/PSUM only"
        )
    if not view.shape:
        raise NkiInterpreterError(f"{what}: operand {view!r} has no partition dimension")
    if view.shape[0] > PMAX:
        raise NkiLimitError(f"{what}: {view.shape[0]} partitions > {PMAX}")
    return view


def _per_partition(view: View) -> int:
    return int(np.prod(view.shape[1:], dtype=np.int64)) if len(view.shape) > 1 else 1


def _same_layout(a: View, b: View, what: str) -> None:
    if a.shape[0] != b.shape[0] or _per_partition(a) != _per_partition(b):
        raise NkiInterpreterError(
            f"{what}: {a.shape} and {b.shape} differ in partitions or elements per partition"
        )


def _write_like(dst: View, values: np.ndarray, what: str) -> None:
    dst.write(np.asarray(values, dtype=np.float32).reshape(dst.shape), what)


def _scalar_or_vector(
    operand: Any, partitions: int, what: str, float32_only: bool = False
) -> View | float:
    """A compile-time scalar, or an on-chip [P, 1] vector broadcast along the free axes
    (checked, not read: see :func:`_value`).

    ``float32_only``: a vector operand must be a float32 tile (tensor_scalar operands and
    the activation scale, per their nki.isa documentation)."""
    if isinstance(operand, (int, float, np.floating, np.integer)):
        return float(operand)
    view = _on_chip(operand, what)
    if view.shape[0] != partitions or _per_partition(view) != 1:
        raise NkiInterpreterError(f"{what}: vector operand {view.shape} must be ({partitions}, 1)")
    if float32_only and view.dtype is not float32:
        raise NkiInterpreterError(
            f"{what}: a vector operand must be float32, got {view.dtype!r} "
            "(copy it to a float32 tile first)"
        )
    return view


def _value(checked: View | float, what: str) -> np.ndarray | float:
    if isinstance(checked, View):
        return checked.read(what).reshape(checked.shape[0], 1)
    return checked


def _flat(values: np.ndarray) -> np.ndarray:
    return values.reshape(values.shape[0], -1)


def _op(op: Any, arity: int, what: str) -> nl.Op:
    table = nl.UNARY if arity == 1 else nl.BINARY
    if isinstance(op, nl.Op) and arity == 2 and op.name in nl.NOT_ALU:
        raise NkiInterpreterError(
            f"{what}: {op!r} is not an operator of the engines' ALU (NKI ISA, \"Supported "
            f"Math Operators\"); {nl.NOT_ALU[op.name]}"
        )
    if not isinstance(op, nl.Op) or op.name not in table:
        raise NkiInterpreterError(
            f"{what}: operator {op!r} is not modelled (supported: {sorted(table)})"
        )
    return op


def _issue(engine: str, *operands: View | None, per_partition: int = 0) -> bool:
    """Issue one instruction: advance the clock, mark its operands used now, record its
    cost in the program's budget. True when the kernel is only traced (skip the math)."""
    state = machine.STATE
    state.clock += 1
    for view in operands:
        if view is not None:
            view.tensor.touch()
    views = [v for v in operands if v is not None]
    if state.budget is not None:
        sixteen = all(v.dtype.itemsize == 2 for v in views) and all(
            v.buffer is sbuf for v in views
        )
        state.budget.compute(engine, per_partition, sixteen_bit=sixteen)
    return state.trace


def _maybe_view(operand: Any) -> View | None:
    """The operand as a View when it is a tile (not a compile-time scalar)."""
    return as_view(operand, "operand") if isinstance(operand, (View, machine.Tensor)) else None


# ---------------------------------------------------------------- data movement


def dma_copy(dst: Any, src: Any, name: str | None = None) -> None:
    """dst = src by DMA: HBM<->SBUF, HBM->HBM or SBUF->SBUF, in flat (row-major) order.

    The two sides may differ in shape as long as they hold the same number of elements
    (nki.isa.dma_copy, "Tile size"). A DMA whose source and destination dtypes differ
    converts through float32 ("Data types"). PSUM is not a DMA endpoint ("Memory types":
    SBUF or HBM): copy PSUM to SBUF with tensor_copy first.
    """
    d, s = as_view(dst, "dma_copy dst"), as_view(src, "dma_copy src")
    for v, role in ((d, "dst"), (s, "src")):
        if v.buffer is psum:
            raise NkiInterpreterError(
                f"dma_copy {role} is in PSUM (DMA reads and writes SBUF or HBM); copy PSUM "
                "to SBUF with tensor_copy first"
            )
        if v.buffer is sbuf and v.shape[0] > PMAX:
            raise NkiLimitError(f"dma_copy {role}: {v.shape[0]} partitions > {PMAX}")
    count_d, count_s = int(np.prod(d.shape)), int(np.prod(s.shape))
    if count_d != count_s:
        raise NkiInterpreterError(
            f"dma_copy: dst {d.shape} holds {count_d} elements, src {s.shape} holds {count_s}"
        )
    machine.STATE.clock += 1
    d.tensor.touch()
    s.tensor.touch()
    if machine.STATE.budget is not None:
        side = d if d.buffer is sbuf or s.buffer is not sbuf else s
        partitions = side.shape[0] if side.shape else 1
        per_partition = count_d // max(1, partitions) * side.dtype.itemsize
        machine.STATE.budget.dma(per_partition, count_d * max(d.dtype.itemsize, s.dtype.itemsize))
    if machine.STATE.trace:
        return
    values = s.read("dma_copy src").reshape(d.shape)
    if d.dtype != s.dtype:
        values = np.asarray(values, dtype=np.float32)
    d.write(values, "dma_copy")


def tensor_copy(dst: Any, src: Any, name: str | None = None) -> None:
    """dst = src on chip (SBUF/PSUM to SBUF/PSUM), converting to dst's dtype."""
    d, s = _on_chip(dst, "tensor_copy dst"), _on_chip(src, "tensor_copy src")
    _same_layout(d, s, "tensor_copy")
    if _issue("vector", d, s, per_partition=_per_partition(d)):
        return
    _write_like(d, s.read("tensor_copy src"), "tensor_copy")


def memset(dst: Any, value: float, name: str | None = None) -> None:
    d = _on_chip(dst, "memset dst")
    if _issue("vector", d, per_partition=_per_partition(d)):
        return
    d.write(np.full(d.shape, value, dtype=np.float32), "memset")


def iota(
    dst: Any,
    pattern: Sequence[Sequence[int]],
    offset: int,
    channel_multiplier: int = 0,
    name: str | None = None,
) -> None:
    """dst[p, i] = offset + p * channel_multiplier + affine(pattern, i); dst in SBUF."""
    d = _on_chip(dst, "iota dst")
    if d.buffer is not sbuf:
        raise NkiInterpreterError("iota writes SBUF only")
    values = _affine(d.shape, pattern, offset, channel_multiplier, "iota")
    if _issue("gpsimd", d, per_partition=_per_partition(d)):
        return
    d.write(values.astype(np.float32).reshape(d.shape), "iota")


def _affine(
    shape: tuple[int, ...],
    pattern: Sequence[Sequence[int]],
    offset: int,
    channel_multiplier: int,
    what: str,
) -> np.ndarray:
    steps = [int(s) for s, _ in pattern]
    nums = [int(n) for _, n in pattern]
    free = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
    if int(np.prod(nums)) != free:
        raise NkiInterpreterError(
            f"{what}: pattern {list(pattern)} covers {int(np.prod(nums))} elements, tile has {free}"
        )
    if machine.STATE.trace:
        return np.zeros((1, 1), dtype=np.int64)
    value = np.zeros(nums, dtype=np.int64)
    for axis, (step, num) in enumerate(zip(steps, nums, strict=True)):
        shape_axis = [1] * len(nums)
        shape_axis[axis] = num
        value = value + step * np.arange(num, dtype=np.int64).reshape(shape_axis)
    channels = np.arange(shape[0], dtype=np.int64).reshape(-1, 1) * channel_multiplier
    return int(offset) + channels + value.reshape(1, -1)


# ---------------------------------------------------------------- Scalar Engine


def activation(
    dst: Any, op: Any, data: Any, bias: Any = None, scale: Any = 1.0, name: str | None = None
) -> None:
    """dst = op(data * scale + bias); scale/bias: scalars or (P, 1) vectors."""
    _activation(dst, op, data, bias, scale, None, None, "activation")


def activation_reduce(
    dst: Any,
    op: Any,
    data: Any,
    reduce_op: Any,
    reduce_res: Any,
    bias: Any = None,
    scale: Any = 1.0,
    name: str | None = None,
) -> None:
    """activation, and reduce_res[p] = sum over the free axes of the activated values (nl.add only)."""
    version = machine.STATE.version
    if (
        isinstance(bias, (int, float))
        and version is not None
        and not version.activation_reduce_scalar_bias
    ):
        raise NkiInterpreterError(
            f"activation_reduce: bias must be a [P, 1] vector tile in NKI {version.name} "
            "(a compile-time scalar bias is nisa.activation's, or NKI 0.7's)"
        )
    _activation(dst, op, data, bias, scale, reduce_op, reduce_res, "activation_reduce")


def _activation(
    dst: Any, op: Any, data: Any, bias: Any, scale: Any, reduce_op: Any, reduce_res: Any, what: str
) -> None:
    d, x = _on_chip(dst, f"{what} dst"), _on_chip(data, f"{what} data")
    _same_layout(d, x, what)
    fn = _op(op, 1, what)
    p = x.shape[0]
    scale_c = _scalar_or_vector(scale, p, f"{what} scale", float32_only=True)
    bias_c = None if bias is None else _scalar_or_vector(bias, p, f"{what} bias")
    r = None
    if reduce_res is not None:
        if reduce_op is not nl.add:
            raise NkiInterpreterError(
                f"{what}: reduce_op must be nl.add (Scalar Engine reduce registers only sum)"
            )
        r = _on_chip(reduce_res, f"{what} reduce_res")
        if r.shape[0] != p or _per_partition(r) != 1:
            raise NkiInterpreterError(f"{what}: reduce_res {r.shape} must be ({p}, 1)")
    operands = (d, x, _maybe_view(scale_c), _maybe_view(bias_c), r)
    if _issue("scalar", *operands, per_partition=_per_partition(x)):
        return
    values = _flat(x.read(f"{what} data")) * _value(scale_c, f"{what} scale")
    if bias_c is not None:
        values = values + _value(bias_c, f"{what} bias")
    result = fn.scalar_fn(values)
    if r is not None:
        _write_like(r, result.sum(axis=1, dtype=np.float32), what)
    _write_like(d, result, what)


def reciprocal(dst: Any, data: Any, name: str | None = None) -> None:
    d, x = _on_chip(dst, "reciprocal dst"), _on_chip(data, "reciprocal data")
    _same_layout(d, x, "reciprocal")
    if _issue("vector", d, x, per_partition=_per_partition(x)):
        return
    _write_like(d, 1.0 / x.read("reciprocal data"), "reciprocal")


# ---------------------------------------------------------------- Vector Engine


def tensor_tensor(dst: Any, data1: Any, data2: Any, op: Any, name: str | None = None) -> None:
    """dst = data1 <op> data2 elementwise; the two inputs may not both be in PSUM."""
    d, a, b = (
        _on_chip(dst, "tensor_tensor dst"),
        _on_chip(data1, "tensor_tensor data1"),
        _on_chip(data2, "tensor_tensor data2"),
    )
    if a.buffer is psum and b.buffer is psum:
        raise NkiInterpreterError("tensor_tensor: data1 and data2 cannot both be in PSUM")
    _same_layout(a, b, "tensor_tensor")
    _same_layout(d, a, "tensor_tensor")
    fn = _op(op, 2, "tensor_tensor")
    if _issue("vector", d, a, b, per_partition=_per_partition(a)):
        return
    _write_like(
        d,
        fn.fn(_flat(a.read("tensor_tensor data1")), _flat(b.read("tensor_tensor data2"))),
        "tensor_tensor",
    )


def tensor_scalar(
    dst: Any,
    data: Any,
    op0: Any,
    operand0: Any,
    reverse0: bool = False,
    op1: Any = None,
    operand1: Any = None,
    reverse1: bool = False,
    name: str | None = None,
) -> None:
    """dst = (data <op0> operand0) <op1> operand1; operands: scalars or (P, 1) vectors."""
    d, x = _on_chip(dst, "tensor_scalar dst"), _on_chip(data, "tensor_scalar data")
    _same_layout(d, x, "tensor_scalar")
    p = x.shape[0]
    f0 = _op(op0, 2, "tensor_scalar op0")
    o0 = _scalar_or_vector(operand0, p, "tensor_scalar operand0", float32_only=True)
    if (op1 is None) != (operand1 is None):
        raise NkiInterpreterError("tensor_scalar: op1 and operand1 must be given together")
    f1 = o1 = None
    if op1 is not None:
        f1 = _op(op1, 2, "tensor_scalar op1")
        o1 = _scalar_or_vector(operand1, p, "tensor_scalar operand1", float32_only=True)
    operands = (d, x, _maybe_view(o0), _maybe_view(o1))
    if _issue("vector", *operands, per_partition=_per_partition(x)):
        return
    values = _flat(x.read("tensor_scalar data"))
    v0 = _value(o0, "tensor_scalar operand0")
    values = f0.fn(v0, values) if reverse0 else f0.fn(values, v0)
    if f1 is not None and o1 is not None:
        v1 = _value(o1, "tensor_scalar operand1")
        values = f1.fn(v1, values) if reverse1 else f1.fn(values, v1)
    _write_like(d, np.broadcast_to(values, (p, _per_partition(x))), "tensor_scalar")


_REDUCERS = {"add": np.sum, "maximum": np.max, "minimum": np.min, "multiply": np.prod}


def tensor_reduce(
    dst: Any,
    op: Any,
    data: Any,
    axis: Any,
    negate: bool = False,
    keepdims: bool = False,
    name: str | None = None,
) -> None:
    """dst = op-reduction of data over the given free axes, which must end at the last axis."""
    d, x = _on_chip(dst, "tensor_reduce dst"), _on_chip(data, "tensor_reduce data")
    axes = sorted([axis] if isinstance(axis, int) else list(axis))
    rank = len(x.shape)
    if not axes or axes[0] < 1 or axes != list(range(axes[0], rank)):
        raise NkiInterpreterError(
            f"tensor_reduce: axis {axis} must be consecutive free axes ending at axis {rank - 1}"
        )
    if not isinstance(op, nl.Op) or op.name not in _REDUCERS:
        raise NkiInterpreterError(f"tensor_reduce: reduction {op!r} is not modelled")
    kept = int(np.prod(x.shape[1 : axes[0]], dtype=np.int64))
    if d.shape[0] != x.shape[0] or _per_partition(d) != kept:
        raise NkiInterpreterError(
            f"tensor_reduce: dst {d.shape} does not hold the reduction of {x.shape} over {axes}"
        )
    if _issue("vector", d, x, per_partition=_per_partition(x)):
        return
    result = _REDUCERS[op.name](
        x.read("tensor_reduce data"), axis=tuple(axes), keepdims=keepdims
    ).astype(np.float32)
    _write_like(d, -result if negate else result, "tensor_reduce")


def affine_select(
    dst: Any,
    pattern: Sequence[Sequence[int]],
    channel_multiplier: int,
    on_true_tile: Any,
    on_false_value: float,
    cmp_op: Any = nl.equal,
    offset: int = 0,
    name: str | None = None,
) -> None:
    """dst = on_true_tile where cmp_op(offset + p*channel_multiplier + affine(pattern, i), 0),
    else on_false_value; dst and on_true_tile in SBUF (GpSimd Engine)."""
    d, t = _on_chip(dst, "affine_select dst"), _on_chip(on_true_tile, "affine_select on_true_tile")
    for view, role in ((d, "dst"), (t, "on_true_tile")):
        if view.buffer is not sbuf:
            raise NkiInterpreterError(
                f"affine_select: {role} is in {view.buffer!r}; it must be in SBUF "
                "(nki.isa.affine_select, \"Memory types\"): copy PSUM to SBUF first"
            )
    _same_layout(d, t, "affine_select")
    cmp = _op(cmp_op, 2, "affine_select cmp_op")
    value = _affine(t.shape, pattern, offset, channel_multiplier, "affine_select")
    if _issue("gpsimd", d, t, per_partition=_per_partition(t)):
        return
    keep = cmp.fn(value.astype(np.float32), 0.0) != 0
    _write_like(
        d,
        np.where(keep, _flat(t.read("affine_select on_true_tile")), np.float32(on_false_value)),
        "affine_select",
    )


# ---------------------------------------------------------------- Tensor Engine


def nc_matmul(
    dst: Any, stationary: Any, moving: Any, accumulate: bool | None = None, name: str | None = None
) -> None:
    """dst[M, N] (+)= stationary[K, M].T @ moving[K, N] on the Tensor Engine.

    Inputs in SBUF, output in float32 PSUM. K <= 128, M <= 128, N <= 512. The two inputs
    may differ in dtype unless one is float32, then both must be. ``accumulate``:
    False overwrites; True accumulates onto what an earlier matmul wrote; None (default)
    overwrites elements no matmul has written and accumulates onto the others.
    Accumulating onto PSUM that another instruction wrote (a memset, a copy) is undefined
    on the hardware and raises PsumAccumulateError here.
    """
    d = as_view(dst, "nc_matmul dst")
    s, m = as_view(stationary, "nc_matmul stationary"), as_view(moving, "nc_matmul moving")
    _check_matmul_operands(d, s, m)
    if _issue_matmul(m.shape[1], s.dtype is float32, d, s, m):
        return
    product = s.read("nc_matmul stationary").T.astype(np.float64) @ m.read(
        "nc_matmul moving"
    ).astype(np.float64)
    product = product.astype(np.float32)
    written = d.tensor.written[d.index]
    by_matmul = d.tensor.by_matmul[d.index]
    if accumulate is not False:
        foreign = written & ~by_matmul
        if foreign.any() or (accumulate is True and not by_matmul.all()):
            raise PsumAccumulateError(
                f"nc_matmul accumulate={accumulate}: {int(np.count_nonzero(~by_matmul))} element(s) "
                f"of {d.tensor!r} were not written by an earlier matmul (memset/copy/never); "
                "accumulating onto them is undefined on the hardware: start the group with "
                "accumulate=False (or a fresh PSUM tile) and add any bias after the matmuls"
            )
        product = np.where(by_matmul, d.tensor.values[d.index], 0.0).astype(np.float32) + product
    d.write(product, "nc_matmul", by_matmul=True)


def _issue_matmul(columns: int, float32_inputs: bool, *operands: View) -> bool:
    state = machine.STATE
    state.clock += 1
    for view in operands:
        view.tensor.touch()
    if state.budget is not None:
        state.budget.matmul(columns, float32_inputs)
    return state.trace


def _check_matmul_operands(d: View, s: View, m: View) -> None:
    if d.buffer is not psum:
        raise NkiInterpreterError(f"nc_matmul writes PSUM; dst is in {d.buffer!r}")
    for v, role in ((s, "stationary"), (m, "moving")):
        if v.buffer is not sbuf:
            raise NkiInterpreterError(f"nc_matmul {role} must be in SBUF, is in {v.buffer!r}")
        if len(v.shape) != 2:
            raise NkiInterpreterError(f"nc_matmul {role} must be a 2-D tile, got {v.shape}")
    if (s.dtype is float32) != (m.dtype is float32):
        raise NkiInterpreterError(
            f"nc_matmul: stationary {s.dtype!r} and moving {m.dtype!r}: when one input is "
            "float32 the other must be float32 too (cast on chip first)"
        )
    (k, mm), (k2, n) = s.shape, m.shape
    if k != k2:
        raise NkiInterpreterError(f"nc_matmul: contraction (partition) sizes differ, {k} vs {k2}")
    if k > PMAX:
        raise NkiLimitError(f"nc_matmul: contraction dimension {k} > {PMAX} partitions")
    if mm > MATMUL_STATIONARY_FMAX:
        raise NkiLimitError(f"nc_matmul: stationary free dimension {mm} > {MATMUL_STATIONARY_FMAX}")
    if n > MATMUL_MOVING_FMAX:
        raise NkiLimitError(f"nc_matmul: moving free dimension {n} > {MATMUL_MOVING_FMAX}")
    if d.shape != (mm, n):
        raise NkiInterpreterError(f"nc_matmul: dst {d.shape} must be ({mm}, {n})")
    if d.dtype is not float32:
        raise NkiInterpreterError("nc_matmul: PSUM results are float32 on Trn2 (NeuronCore-v3)")


def nc_transpose(dst: Any, data: Any, name: str | None = None) -> None:
    """dst[F, P] = data[P, F]^T on the Tensor Engine: data in SBUF (P, F <= 128), dst in PSUM."""
    d, x = as_view(dst, "nc_transpose dst"), as_view(data, "nc_transpose data")
    if x.buffer is not sbuf or d.buffer is not psum:
        raise NkiInterpreterError("nc_transpose (Tensor Engine) reads SBUF and writes PSUM")
    if len(x.shape) != 2 or x.shape[0] > PMAX or x.shape[1] > PMAX:
        raise NkiLimitError(f"nc_transpose: tile {x.shape} must be 2-D and at most {PMAX}x{PMAX}")
    if d.shape != (x.shape[1], x.shape[0]):
        raise NkiInterpreterError(f"nc_transpose: dst {d.shape} must be {(x.shape[1], x.shape[0])}")
    if d.dtype != x.dtype:
        raise NkiInterpreterError("nc_transpose: dst must have the input's dtype")
    if _issue_matmul(x.shape[0], x.dtype is float32, d, x):
        return
    d.write(x.read("nc_transpose data").T, "nc_transpose")
