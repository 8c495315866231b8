"""What a kernel issues per program: instructions per engine, DMA sizes, an engine-time
estimate from the documented engine rates.

Every ``nisa`` call the interpreter runs is recorded here (``machine.STATE.budget``),
whether it executes the math or only traces shapes (``kernel.trace(...)``, for shapes too
large to run in NumPy). The time estimate is a model built from documented figures, not
a measurement (sources in kernels/README.md, section 6):

- compute engines (NKI 0.6 Trainium2 architecture guide, "Compute Engine
  Specifications"): Tensor 2.4 GHz, Vector 0.96 GHz at 256 elements a cycle (512 when
  every operand is 16-bit), Scalar 1.2 GHz at 128 elements a cycle, GpSimd 1.2 GHz
  (width undocumented: modelled as Scalar's); an instruction costs
  ``MIN_II + max(MIN_II, cycles of work)`` with ``MIN_II`` = 64 cycles (the
  activation_reduce cost formula of the NKI docs, "roughly 64 engine cycles";
  the performance guide puts the static overhead "in the order of ~100 cycles");
- a matmul streams its moving tensor one column (a 128-element vector) a cycle, at least
  the 64-cycle MM_INIT_LATENCY (performance guide, Opt #7); float32 inputs are charged 4x
  (an assumption: the table gives no float32 width); a Tensor Engine transpose is a
  matmul against the identity;
- DMA (NKI DMA bandwidth guide): 16 engines x 23 B/ns = 368 GB/s per NeuronCore,
  reached from 2 KiB per partition (below it, charged at bytes_per_partition / 2 KiB of
  that rate), plus ~1.3 us of setup per transfer spread over the 16 queues.

Engines run in parallel, so ``bound_us`` (the busiest engine) is a lower bound on the
kernel's time and the per-engine split says which engine to relieve; dependencies,
queueing and overlap are not modelled.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")
FREQ_GHZ = {"tensor": 2.4, "vector": 0.96, "scalar": 1.2, "gpsimd": 1.2}
# elements a cycle per partition (the documented width divided over 128 lanes)
PER_PARTITION_RATE = {"vector": 2.0, "vector16": 4.0, "scalar": 1.0, "gpsimd": 1.0}
MIN_II = 64
MM_INIT_LATENCY = 64
DMA_BYTES_PER_US = 368_000.0  # 368 GB/s
DMA_FULL_RATE_BYTES = 2048  # per partition
DMA_SETUP_US = 1.3 / 16


@dataclass
class Budget:
    """One program's issued work."""

    instructions: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ENGINES, 0))
    engine_us: dict[str, float] = field(default_factory=lambda: dict.fromkeys(ENGINES, 0.0))
    dma_bytes_per_partition: list[int] = field(default_factory=list)
    dma_bytes: int = 0

    def compute(self, engine: str, elements_per_partition: int, sixteen_bit: bool = False) -> None:
        """One Scalar/Vector/GpSimd instruction over ``elements_per_partition``."""
        rate = PER_PARTITION_RATE[
            "vector16" if engine == "vector" and sixteen_bit else engine
        ]
        cycles = MIN_II + max(MIN_II, elements_per_partition / rate)
        self._add(engine, cycles / (FREQ_GHZ[engine] * 1e3))

    def matmul(self, columns: int, float32: bool) -> None:
        """One Tensor Engine instruction streaming ``columns`` moving columns."""
        cycles = max(MM_INIT_LATENCY, columns * (4 if float32 else 1))
        self._add("tensor", cycles / (FREQ_GHZ["tensor"] * 1e3))

    def dma(self, bytes_per_partition: int, total_bytes: int) -> None:
        share = min(1.0, bytes_per_partition / DMA_FULL_RATE_BYTES) or 1.0 / DMA_FULL_RATE_BYTES
        self.dma_bytes_per_partition.append(bytes_per_partition)
        self.dma_bytes += total_bytes
        self._add("dma", DMA_SETUP_US + total_bytes / (DMA_BYTES_PER_US * share))

    def _add(self, engine: str, us: float) -> None:
        self.instructions[engine] += 1
        self.engine_us[engine] += us

    @property
    def total_instructions(self) -> int:
        return sum(self.instructions.values())

    @property
    def bound_us(self) -> float:
        return max(self.engine_us.values())

    def summary(self) -> dict[str, Any]:
        """A JSON-ready summary (what the README table and the budget tests read)."""
        sizes = self.dma_bytes_per_partition or [0]
        return {
            "instructions": self.total_instructions,
            "by_engine": {e: n for e, n in self.instructions.items() if n},
            "dmas": len(self.dma_bytes_per_partition),
            "dma_bytes_per_partition_min": min(sizes),
            "dma_bytes_per_partition_median": int(statistics.median(sizes)),
            "dmas_under_2KiB": sum(1 for b in self.dma_bytes_per_partition if b < 2048),
            "engine_us": {e: round(t, 2) for e, t in self.engine_us.items() if t},
            "bound_us": round(self.bound_us, 2),
            "bound_engine": max(self.engine_us, key=lambda e: self.engine_us[e]),
        }
