"""Host memory on CPU: glibc keeps freed blocks in its heap instead of handing them back.

glibc serves every allocation at or above its mmap threshold (32 MiB at most) with a
fresh ``mmap`` and returns it with ``munmap`` on free. A CPU training step allocates and
frees dozens of such tensors (one MLP activation at 8,192 tokens x 1,024 float32 is
32 MiB), so each step the kernel maps, faults in and zeroes them again: on the 2-core
CI VM a fresh 64 MiB tensor took 19 ms to fill against 5 ms for a reused one, and the
compiled step of ``recipes/tinyshakespeare.yaml`` ran 3-11% faster with the heap keeping
them (``benchmarks/bench_vs_nanochat.py`` runs trnf this way).

glibc reads its tunables from the environment when a process starts, so ``trnf train``
starts a CPU training process with ``KEEP_FREED`` (no mmap for malloc, a 1 GiB trim
threshold): the training loop's steady state then reuses the same heap blocks, and the
process keeps its high-water mark of host memory until it exits, which a training
process does anyway. ``TRNF_HOST_MALLOC=system``, or any of these variables set by the
user, leaves glibc's defaults alone. Other C libraries ignore the variables.

Runtime layer: standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

HOST_MALLOC_ENV = "TRNF_HOST_MALLOC"
KEEP_FREED = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
# Devices whose training runs on the host heap ("auto" resolves to the CPU without an
# accelerator; with one, keeping host blocks costs nothing).
HOST_DEVICES = ("cpu", "auto")


def keep_freed_env(device: str, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The variables to start a training process on ``device`` with ({} for none)."""
    if device not in HOST_DEVICES or environ.get(HOST_MALLOC_ENV, "").strip().lower() == "system":
        return {}
    if any(name in environ for name in KEEP_FREED):
        return {}  # the user tuned glibc themselves
    return dict(KEEP_FREED)


def kept(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process was started with glibc keeping freed blocks."""
    return environ.get("MALLOC_MMAP_MAX_") == "0"
