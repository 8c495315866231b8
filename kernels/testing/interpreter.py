"""Run a kernel file's own source with this package standing in for ``nki``.

The mechanism: :func:`load_kernel_module` reads ``kernels/<name>.py``, compiles it under
its real file name, and executes it as a fresh module while ``sys.modules`` maps
``nki``, ``nki.language`` and ``nki.isa`` to the stand-ins in this package. The kernel's
``import nki`` / ``import nki.language as nl`` / ``import nki.isa as nisa`` therefore bind
to the interpreter, and ``@nki.jit`` wraps the function in :class:`InterpretedKernel`.
``sys.modules`` is restored afterwards, so a real ``nki`` (when installed) is untouched
and the same file still imports normally for ``nki.simulate`` or the device.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import isa, language, machine, subset

KERNELS_DIR = Path(__file__).resolve().parent.parent


class HostTensor:
    """A kernel argument with an explicit NKI dtype (NumPy has no bfloat16)."""

    def __init__(self, values: np.ndarray, dtype: machine.DType) -> None:
        self.values = np.asarray(values, dtype=np.float32 if dtype.is_float else dtype.storage)
        self.dtype = dtype


def bf16(values: np.ndarray) -> HostTensor:
    """A bfloat16 kernel argument (values rounded to bfloat16)."""
    return HostTensor(machine.round_bf16(np.asarray(values, dtype=np.float32)), machine.bfloat16)


MAX_GRID = 2  # Trn2: LNC=2 at most (two physical NeuronCores per logical core)


class InterpretedKernel:
    """What ``@nki.jit`` returns under the interpreter: call it with NumPy arrays.

    ``kernel[n](...)`` launches it on an SPMD grid of n programs (the LNC degree): each
    program runs with ``nl.program_id(0)`` = 0..n-1 and its own on-chip memory, and the
    programs' writes to the shared outputs must cover every element exactly once.
    """

    def __init__(self, fn: Callable[..., Any], grid: int = 1) -> None:
        self.fn = fn
        self.grid = grid
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__doc__ = fn.__doc__

    def __getitem__(self, grid: Any) -> InterpretedKernel:
        dims = grid if isinstance(grid, tuple) else (grid,)
        if len(dims) != 1 or not isinstance(dims[0], int) or not 1 <= dims[0] <= MAX_GRID:
            raise machine.NkiInterpreterError(
                f"{self.__name__}[{grid}]: the launch grid is one number, the LNC degree "
                f"(1..{MAX_GRID} on Trn2)"
            )
        return InterpretedKernel(self.fn, dims[0])

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run on NumPy arrays / HostTensors; returns float32 (or integer) NumPy arrays."""
        result = self.run_typed(*args, **kwargs)
        if isinstance(result, tuple) and result and isinstance(result[0], tuple):
            return tuple(values for values, _ in result)
        return result[0]

    def run_typed(self, *args: Any, **kwargs: Any) -> Any:
        """Like calling the kernel, but each output comes as (values, nl dtype)."""
        if machine.STATE.allocator is not None:
            raise machine.NkiInterpreterError("nested kernel calls are not modelled")
        hbm_args = [_to_hbm(a, i) for i, a in enumerate(args)]
        results = []
        try:
            for pid in range(self.grid):
                machine.STATE.allocator = machine.Allocator()  # each core has its own SBUF
                machine.STATE.program_id, machine.STATE.num_programs = pid, self.grid
                results.append(self.fn(*hbm_args, **kwargs))
        finally:
            machine.STATE.allocator = None
            machine.STATE.program_id, machine.STATE.num_programs = 0, 1
        return _from_hbm(_merge_programs(results))


def _merge_programs(results: list[Any]) -> Any:
    """The shared outputs as all programs left them; each element written exactly once."""
    if len(results) == 1:
        return results[0]
    first = results[0]
    if isinstance(first, tuple):
        return tuple(_merge_programs([r[k] for r in results]) for k in range(len(first)))
    parts = [r for r in results if isinstance(r, machine.Tensor)]
    if len(parts) != len(results):
        return first  # _output reports the wrong return type
    count = np.sum([p.written for p in parts], axis=0)
    if (count > 1).any():
        raise machine.GridCoverageError(
            f"output {first.shape}: {int(np.count_nonzero(count > 1))} element(s) written by more "
            f"than one of the {len(parts)} programs; split the work with nl.program_id"
        )
    merged = machine.Tensor(first.shape, first.dtype, first.buffer, name=first.name)
    for p in parts:
        merged.values[p.written] = p.values[p.written]
    merged.written[...] = count == 1
    return merged


def _to_hbm(arg: Any, position: int) -> Any:
    if isinstance(arg, HostTensor):
        values, dtype = arg.values, arg.dtype
    elif isinstance(arg, np.ndarray):
        values, dtype = arg, machine.dtype_of(arg)
    else:
        return arg  # a compile-time constant (int, float, tuple)
    tensor = machine.Tensor(values.shape, dtype, machine.hbm, name=f"arg{position}")
    tensor.values[...] = machine.cast(values, dtype)
    tensor.written[...] = True
    return tensor


def _from_hbm(result: Any) -> Any:
    if isinstance(result, tuple):
        return tuple(_from_hbm(r) for r in result)
    return _output(result), result.dtype if isinstance(result, machine.Tensor) else None


def _output(result: Any) -> np.ndarray:
    if not isinstance(result, machine.Tensor):
        raise machine.NkiInterpreterError(
            f"a kernel returns HBM tensors, got {type(result).__name__}"
        )
    if result.buffer is not machine.shared_hbm:
        raise machine.NkiInterpreterError(
            f"kernel outputs must be allocated in nl.shared_hbm, got {result.buffer!r}"
        )
    if not result.written.all():
        missing = int(result.written.size - np.count_nonzero(result.written))
        raise machine.UninitializedReadError(
            f"kernel output {result.shape}: {missing} element(s) were never written"
        )
    return np.array(
        result.values, dtype=np.float32 if result.dtype.is_float else result.dtype.storage
    )


def _jit(fn: Callable[..., Any] | None = None, **_: Any) -> Any:
    return InterpretedKernel(fn) if fn is not None else InterpretedKernel


def _fake_nki() -> dict[str, types.ModuleType]:
    nki = types.ModuleType("nki")
    nki.__doc__ = "kernels.testing stand-in for nki"
    nki.jit = _jit
    nki.language = language
    nki.isa = isa
    return {"nki": nki, "nki.language": language, "nki.isa": isa}


def load_kernel_module(name: str, patches: Sequence[tuple[str, str]] = ()) -> types.ModuleType:
    """Execute ``kernels/<name>.py`` (or a path) against the interpreter; return the module.

    ``patches`` are (old, new) source replacements, each of which must match exactly once:
    how tests plant a mutation in the real kernel source.
    """
    path = Path(name) if name.endswith(".py") else KERNELS_DIR / f"{name}.py"
    source = path.read_text(encoding="utf-8")
    for old, new in patches:
        count = source.count(old)
        if count != 1:
            raise ValueError(
                f"patch {old!r} matches {count} times in {path}, expected exactly once"
            )
        source = source.replace(old, new)
    subset.check_source(source, path)
    module = types.ModuleType(f"kernels_interpreted.{path.stem}")
    module.__file__ = str(path)
    saved = {key: sys.modules.get(key) for key in ("nki", "nki.language", "nki.isa")}
    sys.modules.update(_fake_nki())
    try:
        exec(compile(source, str(path), "exec"), module.__dict__)
    finally:
        for key, value in saved.items():
            if value is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = value
    return module
