"""Host memory on CPU: keep freed blocks in the heap instead of handing them back to Linux.

glibc serves every allocation at or above its mmap threshold (32 MiB at most) with a
fresh ``mmap`` and returns it with ``munmap`` on free. A CPU training step allocates and
frees dozens of such tensors (one MLP activation at 8,192 tokens x 1,024 float32 is
32 MiB), so each step the kernel maps, faults in and zeroes them again: a fresh 64 MiB
tensor took 19 ms to fill against 5 ms for a reused one on the 2-core CI VM, and the
compiled step of ``recipes/tinyshakespeare.yaml`` ran about 7% faster with the heap
keeping them (``benchmarks/bench_vs_nanochat.py`` measures the step both ways).

``keep_freed_memory`` turns glibc's mmap path off (``M_MMAP_MAX`` 0) and raises the
trim threshold, so the training loop's steady state reuses the same heap blocks. The
cost: the process keeps its high-water mark of host memory until it exits, which a
training process does anyway. ``TRNF_HOST_MALLOC=system`` leaves glibc's defaults.

Only CPU training uses it (accelerator tensors do not live in the host heap), and only
with glibc (musl and macOS have no ``mallopt``). Runtime layer: standard library only.
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Mapping

HOST_MALLOC_ENV = "TRNF_HOST_MALLOC"
# mallopt parameter numbers from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
# Heap memory above this, free at the top of the heap, would be returned to the OS.
_TRIM_THRESHOLD = 1 << 30


def keep_freed_memory(device_type: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Make glibc keep freed blocks for reuse when this process trains on the CPU; True
    when applied (the run's summary records it)."""
    if device_type != "cpu" or environ.get(HOST_MALLOC_ENV, "").strip().lower() == "system":
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    # mallopt returns 1 on success; both or neither, so a half-applied policy never runs.
    if libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD) != 1:
        return False
    return bool(libc.mallopt(_M_MMAP_MAX, 0) == 1)
