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

import os
import sys
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import isa, language, machine, subset, versions
from .budget import Budget

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
LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"


class ArgSpec:
    """A kernel argument given by shape and dtype only, for :meth:`InterpretedKernel.trace`."""

    def __init__(self, shape: tuple[int, ...], dtype: machine.DType = machine.bfloat16) -> None:
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype


def spec(shape: tuple[int, ...], dtype: str = "bfloat16") -> ArgSpec:
    return ArgSpec(shape, machine.DTYPES[dtype])


class InterpretedKernel:
    """What ``@nki.jit`` returns under the interpreter: call it with NumPy arrays.

    ``kernel[n](...)`` (or ``kernel[(n,)]``) launches it on an SPMD grid of n programs
    (the LNC degree): each program runs with ``nl.program_id(0)`` = 0..n-1 and its own
    on-chip memory, and the programs' writes to the shared outputs must cover every
    element exactly once. ``version``: the NKI version whose rules apply (versions.py).
    """

    def __init__(
        self, fn: Callable[..., Any], grid: int = 1, version: versions.NkiVersion | None = None
    ) -> None:
        self.fn = fn
        self.grid = grid
        self.version = version or versions.resolve()
        self.last_budgets: list[Budget] = []  # each program's, from the latest run or trace
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__doc__ = fn.__doc__

    def __getitem__(self, grid: Any) -> InterpretedKernel:
        dims = grid if isinstance(grid, tuple) else (grid,)
        if len(dims) != 1 or not isinstance(dims[0], int) or not 1 <= dims[0] <= MAX_GRID:
            raise machine.NkiInterpreterError(
                f"{self.__name__}[{grid}]: the launch grid is one number, the LNC degree "
                f"(1..{MAX_GRID} on Trn2)"
            )
        return InterpretedKernel(self.fn, dims[0], self.version)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run on NumPy arrays / HostTensors; returns float32 (or integer) NumPy arrays."""
        result = self.run_typed(*args, **kwargs)
        if isinstance(result, tuple) and result and isinstance(result[0], tuple):
            return tuple(values for values, _ in result)
        return result[0]

    def run_typed(self, *args: Any, **kwargs: Any) -> Any:
        """Like calling the kernel, but each output comes as (values, nl dtype)."""
        results, _ = self._run(args, kwargs, trace=False)
        return _from_hbm(_merge_programs(results))

    def trace(self, *args: Any, **kwargs: Any) -> list[Budget]:
        """Each program's budget at these argument shapes (ArgSpecs or arrays), without
        executing the math: every rule that depends on shapes, buffers and dtypes is still
        checked, the ones that depend on values (uninitialised reads, PSUM accumulation,
        output coverage) are not."""
        _, budgets = self._run(args, kwargs, trace=True)
        return budgets

    def _run(self, args: Any, kwargs: Any, trace: bool) -> tuple[list[Any], list[Budget]]:
        state = machine.STATE
        if state.allocator is not None:
            raise machine.NkiInterpreterError("nested kernel calls are not modelled")
        self._check_lnc()
        results, budgets = [], []
        state.trace, state.version = trace, self.version
        try:
            hbm_args = [_to_hbm(a, i) for i, a in enumerate(args)]
            for pid in range(self.grid):
                state.allocator = machine.Allocator()  # each core has its own SBUF
                state.program_id, state.num_programs = pid, self.grid
                state.clock, state.budget = 0, Budget()
                results.append(self.fn(*hbm_args, **kwargs))
                state.allocator.check()
                budgets.append(state.budget)
        finally:
            state.allocator, state.budget, state.trace, state.version = None, None, False, None
            state.program_id, state.num_programs, state.clock = 0, 1, 0
        _check_output_buffers(results, self.grid)
        self.last_budgets = budgets
        return results, budgets

    def _check_lnc(self) -> None:
        """NKI 0.7 rejects a kernel whose launch grid differs from the process's LNC."""
        env = os.environ.get(LNC_ENV)
        if self.version.lnc_must_match and env is not None and env != str(self.grid):
            raise machine.NkiInterpreterError(
                f"{self.__name__}[{self.grid}]: launched with LNC {self.grid} in a process "
                f"with {LNC_ENV}={env}; NKI {self.version.name} rejects the mismatch"
            )


def _check_output_buffers(results: list[Any], grid: int) -> None:
    """Outputs live in HBM: nl.shared_hbm, or nl.hbm (= private_hbm) under a grid of one
    (each program's private HBM is its own: an LNC=2 kernel's outputs must be shared)."""
    for result in results:
        for out in result if isinstance(result, tuple) else (result,):
            if not isinstance(out, machine.Tensor):
                raise machine.NkiInterpreterError(
                    f"a kernel returns HBM tensors, got {type(out).__name__}"
                )
            if out.buffer.on_chip or (out.buffer is not machine.shared_hbm and grid > 1):
                raise machine.NkiInterpreterError(
                    f"kernel output {out.shape} is in {out.buffer!r}: outputs are allocated in "
                    + ("nl.shared_hbm under an LNC grid" if grid > 1 else "HBM")
                )


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
    if isinstance(arg, ArgSpec):
        return machine.Tensor(arg.shape, arg.dtype, machine.hbm, name=f"arg{position}")
    if isinstance(arg, HostTensor):
        values, dtype = arg.values, arg.dtype
    elif isinstance(arg, np.ndarray):
        values, dtype = arg, machine.dtype_of(arg)
    else:
        return arg  # a compile-time constant (int, float, tuple)
    tensor = machine.Tensor(values.shape, dtype, machine.hbm, name=f"arg{position}")
    if not machine.STATE.trace:
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
    if not result.written.all():
        missing = int(result.written.size - np.count_nonzero(result.written))
        raise machine.UninitializedReadError(
            f"kernel output {result.shape}: {missing} element(s) were never written"
        )
    return np.array(
        result.values, dtype=np.float32 if result.dtype.is_float else result.dtype.storage
    )


def _fake_nki(version: versions.NkiVersion) -> dict[str, types.ModuleType]:
    def jit(fn: Callable[..., Any] | None = None, **_: Any) -> Any:
        if fn is None:
            return lambda f: InterpretedKernel(f, version=version)
        return InterpretedKernel(fn, version=version)

    nki = types.ModuleType("nki")
    nki.__doc__ = f"kernels.testing stand-in for nki {version.name}"
    nki.__version__ = version.name
    nki.jit = jit
    nki.language = language
    nki.isa = isa
    return {"nki": nki, "nki.language": language, "nki.isa": isa}


def load_kernel_module(
    name: str,
    patches: Sequence[tuple[str, str]] = (),
    nki_version: str | None = None,
    portable: bool = False,
) -> types.ModuleType:
    """Execute ``kernels/<name>.py`` (or a path) against the interpreter; return the module.

    ``patches`` are (old, new) source replacements, each of which must match exactly once:
    how tests plant a mutation in the real kernel source. ``nki_version``: the NKI
    release whose rules apply (default: versions.resolve()). ``portable``: also refuse
    legal NKI that older releases did not parse (the shipped kernels' style).
    """
    version = versions.resolve(nki_version)
    path = Path(name) if name.endswith(".py") else KERNELS_DIR / f"{name}.py"
    source = path.read_text(encoding="utf-8")
    for old, new in patches:
        count = source.count(old)
        if count != 1:
            raise ValueError(
                f"patch {old!r} matches {count} times in {path}, expected exactly once"
            )
        source = source.replace(old, new)
    subset.check_source(source, path, version, portable)
    module = types.ModuleType(f"kernels_interpreted.{path.stem}")
    module.__file__ = str(path)
    saved = {key: sys.modules.get(key) for key in ("nki", "nki.language", "nki.isa")}
    sys.modules.update(_fake_nki(version))
    try:
        exec(compile(source, str(path), "exec"), module.__dict__)
    finally:
        for key, value in saved.items():
            if value is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = value
    return module
