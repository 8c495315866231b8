"""The machine state of the NKI interpreter: memories, tensors, views and the limits.

A NeuronCore-v3 (Trainium2) as NKI kernels see it, reduced to what can be checked
without timing:

- HBM tensors (kernel arguments, ``nl.shared_hbm`` outputs): any shape.
- SBUF tiles: dimension 0 is the partition dimension, at most 128; SBUF holds
  192 KiB per partition.
- PSUM tiles: at most 128 partitions; one tile must fit one bank (2 KiB per partition,
  512 float32); there are 8 banks.

Every element carries a "written" bit, so reading memory nobody wrote raises
:class:`UninitializedReadError` instead of returning whatever NumPy left there.

Capacity is accounted per *allocation site* (file and line of the ``nl.ndarray`` call),
at the largest size that site ever asked for: a buffer allocated inside a loop body is
reused by every iteration, as the NKI compiler reuses it. This does not model
multi-buffering (the compiler may keep several copies of a site alive to overlap
iterations), so a kernel that fits here can still be rejected for space by the real
allocator; one that does not fit here would not fit there either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

PMAX = 128  # partitions per SBUF/PSUM tile
SBUF_BYTES_PER_PARTITION = 192 * 1024  # 24 MiB / 128
PSUM_BANK_BYTES_PER_PARTITION = 2 * 1024  # 512 float32
PSUM_BANKS = 8
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
hbm = Buffer("hbm", False)
shared_hbm = Buffer("shared_hbm", False)
private_hbm = Buffer("private_hbm", False)


# ---------------------------------------------------------------- tensors and views


class Tensor:
    """One allocation: values, a written-bit per element, its buffer and dtype."""

    def __init__(
        self, shape: tuple[int, ...], dtype: DType, buffer: Buffer, name: str = ""
    ) -> None:
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        self.buffer = buffer
        self.name = name
        self.values = np.zeros(self.shape, dtype=dtype.storage)
        self.written = np.zeros(self.shape, dtype=bool)
        # PSUM: whether each element's last write was a matmul (accumulation may continue
        # onto it) or another instruction (memset, tensor_copy ...: accumulating onto
        # that is undefined, see isa.nc_matmul)
        self.by_matmul = np.zeros(self.shape, dtype=bool)

    def __getitem__(self, index: Any) -> View:
        return View(self, ()).__getitem__(index)

    @property
    def keeps_partition_dim(self) -> bool:
        """On-chip tensors keep dimension 0 (the partitions) when it is indexed by an int."""
        return self.buffer.on_chip

    def full(self) -> View:
        return View(self, tuple(slice(0, s) for s in self.shape))

    def __repr__(self) -> str:
        return f"Tensor({self.name or '?'}, {self.shape}, {self.dtype}, {self.buffer})"


def _normalise(
    shape: tuple[int, ...], index: Any, keep_first: bool = False
) -> tuple[tuple[Any, ...], tuple[int, ...]]:
    """Basic indexing only (ints, unit-step slices, nl.ds): returns (numpy index, shape).

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
                norm.append(slice(int(item), int(item) + 1))
                out_shape.append(1)
            else:
                norm.append(int(item))
            continue
        if not isinstance(item, slice):
            raise NkiInterpreterError(
                f"unsupported index {item!r} (the interpreter models basic slicing only)"
            )
        start, stop, step = (
            item.start or 0,
            size if item.stop is None else item.stop,
            item.step or 1,
        )
        if step != 1:
            raise NkiInterpreterError("strided slices are not modelled by the interpreter")
        if not 0 <= start <= stop <= size:
            raise NkiInterpreterError(
                f"slice {start}:{stop} out of bounds for dimension {dim} of size {size}"
            )
        norm.append(slice(start, stop))
        out_shape.append(stop - start)
    for dim in range(len(index), len(shape)):
        norm.append(slice(0, shape[dim]))
        out_shape.append(shape[dim])
    return tuple(norm), tuple(out_shape)


class View:
    """A rectangular window of a tensor; what instructions read and write."""

    def __init__(self, tensor: Tensor, index: tuple[Any, ...]) -> None:
        self.tensor = tensor
        index, shape = _normalise(tensor.shape, index, tensor.keeps_partition_dim)
        self.index = index
        self.shape = shape

    # views of views: compose by re-indexing the parent's window
    def __getitem__(self, index: Any) -> View:
        if not isinstance(index, tuple):
            index = (index,)
        sub, _ = _normalise(self.shape, index, self.tensor.keeps_partition_dim)
        composed: list[Any] = []
        it = iter(sub)
        for parent in self.index:
            if isinstance(parent, int):
                composed.append(parent)
                continue
            child = next(it)
            if isinstance(child, int):
                composed.append(parent.start + child)
            else:
                composed.append(slice(parent.start + child.start, parent.start + child.stop))
        view = View.__new__(View)
        view.tensor = self.tensor
        view.index = tuple(composed)
        view.shape = tuple(s.stop - s.start for s in composed if isinstance(s, slice))
        return view

    @property
    def dtype(self) -> DType:
        return self.tensor.dtype

    @property
    def buffer(self) -> Buffer:
        return self.tensor.buffer

    def read(self, what: str = "") -> np.ndarray:
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
        values = np.asarray(values)
        if values.shape != self.shape:
            raise NkiInterpreterError(
                f"{what or 'write'}: result shape {values.shape} does not match destination {self.shape}"
            )
        self.tensor.values[self.index] = cast(values, self.dtype)
        self.tensor.written[self.index] = True
        self.tensor.by_matmul[self.index] = by_matmul

    def __repr__(self) -> str:
        return f"View({self.tensor!r}, shape={self.shape})"


def as_view(obj: Any, what: str) -> View:
    if isinstance(obj, Tensor):
        return obj.full()
    if isinstance(obj, View):
        return obj
    raise NkiInterpreterError(
        f"{what}: expected a tensor or a tensor slice, got {type(obj).__name__}"
    )


# ---------------------------------------------------------------- allocation accounting


class Allocator:
    """Per-kernel-call accounting of on-chip memory by allocation site (see module doc)."""

    def __init__(self) -> None:
        self.sbuf_sites: dict[str, int] = {}
        self.psum_sites: dict[str, int] = {}

    def allocate(self, shape: tuple[int, ...], dtype: DType, buffer: Buffer, site: str) -> None:
        if not buffer.on_chip:
            return
        if len(shape) < 1 or shape[0] < 1:
            raise NkiInterpreterError(
                f"{buffer!r} tile {shape} at {site} needs a partition dimension"
            )
        if shape[0] > PMAX:
            raise NkiLimitError(
                f"{buffer!r} tile {shape} at {site}: partition dimension {shape[0]} > {PMAX}"
            )
        per_partition = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        if buffer is psum:
            if per_partition > PSUM_BANK_BYTES_PER_PARTITION:
                raise NkiLimitError(
                    f"PSUM tile {shape} {dtype!r} at {site}: {per_partition} bytes per partition exceed one "
                    f"bank ({PSUM_BANK_BYTES_PER_PARTITION} bytes = 512 float32)"
                )
            self.psum_sites[site] = PSUM_BANK_BYTES_PER_PARTITION
            if len(self.psum_sites) > PSUM_BANKS:
                raise NkiLimitError(
                    f"more than {PSUM_BANKS} PSUM tiles live at once (sites: {sorted(self.psum_sites)})"
                )
        else:
            self.sbuf_sites[site] = max(self.sbuf_sites.get(site, 0), per_partition)
            total = sum(self.sbuf_sites.values())
            if total > SBUF_BYTES_PER_PARTITION:
                raise NkiLimitError(
                    f"SBUF over capacity at {site}: {total} bytes per partition > {SBUF_BYTES_PER_PARTITION}"
                )


class PsumAccumulateError(NkiInterpreterError):
    """nc_matmul accumulated onto PSUM that no matmul initialised (memset, copy ...):
    the hardware result is undefined (nki.isa.nc_matmul, "Accumulation mode")."""


class GridCoverageError(NkiInterpreterError):
    """Under an LNC launch grid, the programs together did not write each output element
    exactly once (an element written by two programs is a race between physical cores)."""


class State:
    """The interpreter state of the kernel call in progress (one at a time).

    ``program_id``/``num_programs``: the SPMD program this run is (``kernel[2]`` runs
    programs 0 and 1, one per physical core of an LNC=2 logical core).
    """

    allocator: Allocator | None = None
    program_id: int = 0
    num_programs: int = 1


STATE = State()
