"""The machine state of the NKI interpreter: memories, tensors, views and the limits.

A NeuronCore-v3 (Trainium2) as NKI kernels see it, reduced to what can be checked
without timing (figures from :data:`TRN2`, sources in kernels/README.md, section 6):

- HBM tensors (kernel arguments, outputs): any shape.
- SBUF tiles: dimension 0 is the partition dimension, at most 128; 212,984 usable bytes
  per partition (of 224 KiB physical).
- PSUM tiles: at most 128 partitions; one tile must fit one bank (2 KiB per partition,
  512 float32); there are 8 banks.

Every element carries a "written" bit, so reading memory nobody wrote raises
:class:`UninitializedReadError` instead of returning whatever NumPy left there.

Capacity is accounted by *lifetime*: every instruction advances a clock, an on-chip
tensor is live from its allocation to the last instruction that touches it, and at the
end of each program the peak of the live SBUF bytes (per partition) and of the live
PSUM banks must fit the target. A tile allocated in a loop body whose iterations never
overlap is one tile, as the compiler reuses it. This does not model multi-buffering
(the compiler may keep several copies alive to overlap iterations) or fragmentation, so
a kernel that fits here can still be rejected for space by the real allocator; one that
does not fit here would not fit there either.

``STATE.trace``: run the kernel for its shapes and counts only (no values, no math), to
report budgets at shapes too large to execute in NumPy (see budget.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Target:
    """The on-chip resources of one NeuronCore of the chip a kernel is checked for."""

    name: str
    pmax: int  # partitions per SBUF/PSUM tile
    sbuf_bytes_per_partition: int  # usable by a kernel
    sbuf_physical_bytes_per_partition: int
    psum_banks: int
    psum_bank_bytes_per_partition: int


# KLR/Trace.lean kernelEnv, arch 3 (NeuronCore-v3): tile_size.total_available_sbuf_size
# 212984; trainium2_arch.rst: 128 partitions of 224 KiB SBUF, PSUM 2 MiB = 8 x 2 KiB banks
# x 128 partitions (KLR's psum pointer: 128 x 0x4000 bytes).
TRN2 = Target("trn2", 128, 212_984, 224 * 1024, 8, 2 * 1024)

PMAX = TRN2.pmax
SBUF_BYTES_PER_PARTITION = TRN2.sbuf_bytes_per_partition
PSUM_BANK_BYTES_PER_PARTITION = TRN2.psum_bank_bytes_per_partition  # 512 float32
PSUM_BANKS = TRN2.psum_banks
MATMUL_STATIONARY_FMAX = 128
MATMUL_MOVING_FMAX = 512


class NkiInterpreterError(Exception):
    """A kernel did something the documented hardware/API semantics do not allow."""


class NkiLimitError(NkiInterpreterError):
    """A tile, an instruction operand or a memory exceeds a documented Trn2 limit."""


class UninitializedReadError(NkiInterpreterError):
    """An instruction read memory that no earlier instruction (or argument) wrote."""


# ---------------------------------------------------------------- dtypes and buffers


@dataclass(frozen=True)
class DType:
    name: str
    itemsize: int
    storage: Any  # the NumPy dtype values are kept in
    is_float: bool

    def __repr__(self) -> str:
        return f"nl.{self.name}"


float32 = DType("float32", 4, np.float32, True)
bfloat16 = DType("bfloat16", 2, np.float32, True)  # stored as float32, rounded to bf16
float16 = DType("float16", 2, np.float16, True)
int32 = DType("int32", 4, np.int32, False)
uint8 = DType("uint8", 1, np.uint8, False)
DTYPES = {d.name: d for d in (float32, bfloat16, float16, int32, uint8)}


def round_bf16(values: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 (ties to even), kept as float32."""
    a = np.ascontiguousarray(values, dtype=np.float32)
    bits = a.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    out = rounded.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(a), a, out)


def cast(values: np.ndarray, dtype: DType) -> np.ndarray:
    """What storing ``values`` into a tensor of ``dtype`` keeps."""
    if dtype is bfloat16:
        return round_bf16(values)
    return np.asarray(values).astype(dtype.storage)


def dtype_of(array: np.ndarray) -> DType:
    for d in (float32, float16, int32, uint8):
        if array.dtype == d.storage:
            return d
    raise NkiInterpreterError(f"unsupported NumPy dtype {array.dtype} for a kernel argument")


@dataclass(frozen=True)
class Buffer:
    name: str
    on_chip: bool

    def __repr__(self) -> str:
        return f"nl.{self.name}"


sbuf = Buffer("sbuf", True)
psum = Buffer("psum", True)
shared_hbm = Buffer("shared_hbm", False)  # visible to every program of the launch grid
private_hbm = Buffer("private_hbm", False)  # visible to one program only
hbm = private_hbm  # nki.language: "HBM - Alias of private_hbm"


# ---------------------------------------------------------------- tensors and views


def _no_truth_value(what: object) -> bool:
    """A tile's data as a Python condition (``while t[0, 0]:``, ``if t:``) is not NKI: a
    condition is evaluated when the kernel is traced (a static ``while``, unrolled) or is a
    single register (a dynamic ``while``, nki-language-guide.rst "Dynamic Control Flow");
    tile data is neither. Without this Python would call every tile true."""
    raise NkiInterpreterError(
        f"{what} used as a condition: tile data is not known when the kernel is traced; a while's "
        "condition is a compile-time value or a register (nisa.register_load, not modelled here)"
    )


class Tensor:
    """One allocation: values, a written-bit per element, its buffer and dtype."""

    def __init__(
        self, shape: tuple[int, ...], dtype: DType, buffer: Buffer, name: str = ""
    ) -> None:
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        self.buffer = buffer
        self.name = name
        self.alloc: Allocation | None = None  # on-chip: its lifetime record
        if STATE.trace:  # shapes and counts only: no storage
            self.values = self.written = self.by_matmul = np.zeros((0,))
            return
        self.values = np.zeros(self.shape, dtype=dtype.storage)
        self.written = np.zeros(self.shape, dtype=bool)
        # PSUM: whether each element's last write was a matmul (accumulation may continue
        # onto it) or another instruction (memset, tensor_copy ...: accumulating onto
        # that is undefined, see isa.nc_matmul)
        self.by_matmul = np.zeros(self.shape, dtype=bool)

    def touch(self) -> None:
        """Mark the tensor used by the instruction now issuing (its lifetime grows)."""
        if self.alloc is not None:
            self.alloc.last = STATE.clock

    def __getitem__(self, index: Any) -> View:
        return View(self, ()).__getitem__(index)

    def __bool__(self) -> bool:
        return _no_truth_value(self)

    @property
    def keeps_partition_dim(self) -> bool:
        """On-chip tensors keep dimension 0 (the partitions) when it is indexed by an int."""
        return self.buffer.on_chip

    def full(self) -> View:
        return View(self, tuple(slice(0, s) for s in self.shape))

    def expand_dim(self, dim: int) -> View:
        return self.full().expand_dim(dim)

    def broadcast(self, dim: int, size: int) -> View:
        return self.full().broadcast(dim, size)

    def __repr__(self) -> str:
        return f"Tensor({self.name or '?'}, {self.shape}, {self.dtype}, {self.buffer})"


def _slice(item: slice, size: int, dim: int) -> slice:
    """A positive-step slice within [0, size), with its stop clamped to the last element."""
    step = 1 if item.step is None else int(item.step)
    start = 0 if item.start is None else int(item.start)
    stop = size if item.stop is None else int(item.stop)
    if step < 1:
        raise NkiInterpreterError(f"slice step {step}: only positive steps are modelled")
    if not 0 <= start <= stop <= size:
        raise NkiInterpreterError(
            f"slice {start}:{stop} out of bounds for dimension {dim} of size {size}"
        )
    count = len(range(start, stop, step))
    return slice(start, start + (count - 1) * step + 1 if count else start, step)


def _extent(item: slice) -> int:
    return len(range(item.start, item.stop, item.step))


def _normalise(
    shape: tuple[int, ...], index: Any, keep_first: bool = False
) -> tuple[tuple[Any, ...], tuple[int, ...]]:
    """Basic indexing (ints, slices with a positive step, nl.ds): (numpy index, shape).

    ``keep_first``: an int on dimension 0 selects a size-1 slice instead of dropping the
    dimension (SBUF/PSUM partition dimension: ``t[0, :]`` has shape (1, F))."""
    if not isinstance(index, tuple):
        index = (index,)
    if len(index) > len(shape):
        raise NkiInterpreterError(f"index {index} has more dimensions than shape {shape}")
    norm: list[Any] = []
    out_shape: list[int] = []
    for dim, item in enumerate(index):
        size = shape[dim]
        if isinstance(item, (int, np.integer)):
            if not 0 <= item < size:
                raise NkiInterpreterError(
                    f"index {item} out of bounds for dimension {dim} of size {size}"
                )
            if dim == 0 and keep_first:
                norm.append(slice(int(item), int(item) + 1, 1))
                out_shape.append(1)
            else:
                norm.append(int(item))
            continue
        if not isinstance(item, slice):
            raise NkiInterpreterError(
                f"unsupported index {item!r} (the interpreter models basic slicing only)"
            )
        sl = _slice(item, size, dim)
        norm.append(sl)
        out_shape.append(_extent(sl))
    for dim in range(len(index), len(shape)):
        norm.append(slice(0, shape[dim], 1))
        out_shape.append(shape[dim])
    return tuple(norm), tuple(out_shape)


def _compose(parent: slice, child: Any) -> Any:
    """The parent-relative ``child`` (an int or a slice of the parent's window) as an
    index into the tensor itself."""
    if isinstance(child, int):
        return parent.start + child * parent.step
    step = parent.step * child.step
    start = parent.start + child.start * parent.step
    count = _extent(child)
    return slice(start, start + (count - 1) * step + 1 if count else start, step)


class View:
    """A rectangular (possibly strided) window of a tensor; what instructions read and write."""

    def __init__(self, tensor: Tensor, index: tuple[Any, ...]) -> None:
        self.tensor = tensor
        index, shape = _normalise(tensor.shape, index, tensor.keeps_partition_dim)
        self.index = index
        self.shape = shape

    def __bool__(self) -> bool:
        return _no_truth_value(f"a view of {self.tensor}")

    # views of views: compose by re-indexing the parent's window
    def __getitem__(self, index: Any) -> View:
        if not isinstance(index, tuple):
            index = (index,)
        sub, _ = _normalise(self.shape, index, self.tensor.keeps_partition_dim)
        composed: list[Any] = []
        it = iter(sub)
        for parent in self.index:
            composed.append(parent if isinstance(parent, int) else _compose(parent, next(it)))
        view = View.__new__(View)
        view.tensor = self.tensor
        view.index = tuple(composed)
        view.shape = tuple(_extent(s) for s in composed if isinstance(s, slice))
        return view

    @property
    def dtype(self) -> DType:
        return self.tensor.dtype

    @property
    def buffer(self) -> Buffer:
        return self.tensor.buffer

    def read(self, what: str = "") -> np.ndarray:
        self.tensor.touch()
        written = self.tensor.written[self.index]
        if not np.all(written):
            missing = int(np.size(written) - np.count_nonzero(written))
            raise UninitializedReadError(
                f"{what or 'read'}: {missing} element(s) of {self.tensor!r} window {self.shape} were never written"
            )
        return np.array(
            self.tensor.values[self.index],
            dtype=np.float32 if self.dtype.is_float else self.dtype.storage,
        )

    def write(self, values: np.ndarray, what: str = "", by_matmul: bool = False) -> None:
        self.tensor.touch()
        values = np.asarray(values)
        if values.shape != self.shape:
            raise NkiInterpreterError(
                f"{what or 'write'}: result shape {values.shape} does not match destination {self.shape}"
            )
        self.tensor.values[self.index] = cast(values, self.dtype)
        self.tensor.written[self.index] = True
        self.tensor.by_matmul[self.index] = by_matmul

    def expand_dim(self, dim: int) -> View:
        """A size-1 dimension inserted at ``dim`` (NkiTensor.expand_dim); not before the
        partition dimension of an on-chip tensor."""
        return DerivedView.of(self).expand_dim(dim)

    def broadcast(self, dim: int, size: int) -> View:
        """Size-1 dimension ``dim`` repeated ``size`` times without a copy
        (NkiTensor.broadcast, a stride-0 view); read-only here."""
        return DerivedView.of(self).broadcast(dim, size)

    def __repr__(self) -> str:
        return f"View({self.tensor!r}, shape={self.shape})"


class DerivedView(View):
    """A view reshaped by expand_dim / broadcast: reads the base window and broadcasts
    it; writes go through only while nothing is broadcast."""

    base: View
    source_shape: tuple[int, ...]  # ``shape`` with 1 wherever a dimension is broadcast

    @classmethod
    def of(cls, view: View) -> DerivedView:
        if isinstance(view, DerivedView):
            return view
        derived = cls.__new__(cls)
        derived.tensor, derived.index, derived.base = view.tensor, view.index, view
        derived.shape = derived.source_shape = view.shape
        return derived

    def _with(self, shape: tuple[int, ...], source: tuple[int, ...]) -> DerivedView:
        derived = DerivedView.of(self.base)
        derived.shape, derived.source_shape = shape, source
        return derived

    def expand_dim(self, dim: int) -> View:
        if not 0 <= dim <= len(self.shape) or (dim == 0 and self.tensor.keeps_partition_dim):
            raise NkiInterpreterError(
                f"expand_dim({dim}) on {self.shape}: not before the partition dimension"
            )
        return self._with(
            self.shape[:dim] + (1,) + self.shape[dim:],
            self.source_shape[:dim] + (1,) + self.source_shape[dim:],
        )

    def broadcast(self, dim: int, size: int) -> View:
        if not 0 <= dim < len(self.shape) or self.shape[dim] != 1:
            raise NkiInterpreterError(f"broadcast({dim}, {size}) on {self.shape}: needs size 1")
        if dim == 0 and self.tensor.keeps_partition_dim:
            raise NkiInterpreterError("broadcast: not along the partition dimension")
        return self._with(self.shape[:dim] + (int(size),) + self.shape[dim + 1 :], self.source_shape)

    def __getitem__(self, index: Any) -> View:
        raise NkiInterpreterError("indexing an expand_dim/broadcast view is not modelled")

    def read(self, what: str = "") -> np.ndarray:
        values = self.base.read(what).reshape(self.source_shape)
        return np.broadcast_to(values, self.shape).copy()

    def write(self, values: np.ndarray, what: str = "", by_matmul: bool = False) -> None:
        if self.source_shape != self.shape:
            raise NkiInterpreterError(f"{what or 'write'}: a broadcast view is read-only")
        self.base.write(np.asarray(values).reshape(self.base.shape), what, by_matmul)


def as_view(obj: Any, what: str) -> View:
    if isinstance(obj, Tensor):
        return obj.full()
    if isinstance(obj, View):
        return obj
    raise NkiInterpreterError(
        f"{what}: expected a tensor or a tensor slice, got {type(obj).__name__}"
    )


# ---------------------------------------------------------------- allocation accounting


@dataclass
class Allocation:
    """One on-chip tensor's footprint and lifetime (clock of its birth and last use)."""

    site: str
    buffer: Buffer
    bytes_per_partition: int
    born: int
    last: int

    @property
    def banks(self) -> int:
        return -(-self.bytes_per_partition // PSUM_BANK_BYTES_PER_PARTITION)


def _peak(allocs: list[Allocation], size: Any) -> tuple[int, int]:
    """(peak of the summed ``size(a)`` over live allocations, the clock at the peak)."""
    events: list[tuple[int, int]] = []
    for a in allocs:
        events.append((a.born, size(a)))
        events.append((a.last + 1, -size(a)))
    events.sort(key=lambda e: (e[0], e[1]))  # frees before allocations at the same clock
    live = peak = when = 0
    for clock, delta in events:
        live += delta
        if live > peak:
            peak, when = live, clock
    return peak, when


class Allocator:
    """Per-program accounting of on-chip memory by lifetime (see the module doc)."""

    def __init__(self, target: Target = TRN2) -> None:
        self.target = target
        self.allocations: list[Allocation] = []

    def allocate(self, tensor: Tensor, site: str) -> None:
        shape, dtype, buffer = tensor.shape, tensor.dtype, tensor.buffer
        if not buffer.on_chip:
            return
        if len(shape) < 1 or shape[0] < 1:
            raise NkiInterpreterError(
                f"{buffer!r} tile {shape} at {site} needs a partition dimension"
            )
        if shape[0] > self.target.pmax:
            raise NkiLimitError(
                f"{buffer!r} tile {shape} at {site}: partition dimension {shape[0]} > {self.target.pmax}"
            )
        per_partition = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        bank = self.target.psum_bank_bytes_per_partition
        if buffer is psum and per_partition > bank:
            raise NkiLimitError(
                f"PSUM tile {shape} {dtype!r} at {site}: {per_partition} bytes per partition exceed one "
                f"bank ({bank} bytes = 512 float32)"
            )
        if buffer is sbuf and per_partition > self.target.sbuf_bytes_per_partition:
            raise NkiLimitError(
                f"SBUF tile {shape} {dtype!r} at {site}: {per_partition} bytes per partition > "
                f"{self.target.sbuf_bytes_per_partition} usable on {self.target.name}"
            )
        born = STATE.clock + 1  # the first instruction that can use it is the next one
        tensor.alloc = Allocation(site, buffer, per_partition, born, born)
        self.allocations.append(tensor.alloc)

    def check(self) -> None:
        """Raise NkiLimitError when the live tiles ever exceeded SBUF or the PSUM banks."""
        t = self.target
        on_sbuf = [a for a in self.allocations if a.buffer is sbuf]
        on_psum = [a for a in self.allocations if a.buffer is psum]
        peak, when = _peak(on_sbuf, lambda a: a.bytes_per_partition)
        if peak > t.sbuf_bytes_per_partition:
            raise NkiLimitError(
                f"SBUF over capacity: {peak} bytes per partition live at instruction {when} > "
                f"{t.sbuf_bytes_per_partition} on {t.name} (live: {_live_sites(on_sbuf, when)})"
            )
        banks, when = _peak(on_psum, lambda a: a.banks)
        if banks > t.psum_banks:
            raise NkiLimitError(
                f"more than {t.psum_banks} PSUM banks live at once: {banks} at instruction {when} "
                f"(live: {_live_sites(on_psum, when)})"
            )


def _live_sites(allocs: list[Allocation], clock: int) -> str:
    sites = sorted({a.site.rsplit("/", 1)[-1] for a in allocs if a.born <= clock <= a.last})
    return ", ".join(sites[:12]) + (" ..." if len(sites) > 12 else "")


class PsumAccumulateError(NkiInterpreterError):
    """nc_matmul accumulated onto PSUM that no matmul initialised (memset, copy ...):
    the hardware result is undefined (nki.isa.nc_matmul, "Accumulation mode")."""


class GridCoverageError(NkiInterpreterError):
    """Under an LNC launch grid, the programs together did not write each output element
    exactly once (an element written by two programs is a race between physical cores)."""


class State:
    """The interpreter state of the kernel call in progress (one at a time).

    ``program_id``/``num_programs``: the SPMD program this run is (``kernel[2]`` runs
    programs 0 and 1, one per physical core of an LNC=2 logical core). ``clock``: the
    instructions issued so far in this program (lifetimes are measured in it).
    ``version``: the NKI version whose rules apply (versions.py). ``budget``: what the
    program issued (budget.py). ``trace``: shapes and counts only.
    """

    allocator: Allocator | None = None
    program_id: int = 0
    num_programs: int = 1
    clock: int = 0
    trace: bool = False
    version: Any = None
    budget: Any = None


STATE = State()
