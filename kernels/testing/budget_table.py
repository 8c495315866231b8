"""Each kernel's per-program budget at a model's per-rank shapes, by tracing (no math).

    python -m kernels.testing.budget_table            # the d12-like table (markdown)
    python -m kernels.testing.budget_table --json     # the same as JSON

The shapes are one rank's in a d12-like run: batch 32 x 1024 positions, width 768,
6 heads of 128 (no GQA), MLP width 3072, vocabulary 8192, bfloat16, launched at LNC 2
(figures per program: the two programs split the work). kernels/README.md, section 7,
holds this table before and after the tuning of the second pass.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any

from .interpreter import ArgSpec, load_kernel_module, spec


@dataclass(frozen=True)
class Shapes:
    batch: int = 32
    seq: int = 1024
    width: int = 768
    heads: int = 6
    kv_heads: int = 6
    head_dim: int = 128
    vocab: int = 8192

    @property
    def rows(self) -> int:
        return self.batch * self.seq


def cases(s: Shapes) -> list[tuple[str, str, str, tuple[Any, ...]]]:
    """(label, kernel file, kernel function, arguments) for every kernel at shapes ``s``."""
    f32 = "float32"
    qkv = (s.batch, s.heads, s.seq, s.head_dim)
    kv = (s.batch, s.kv_heads, s.seq, s.head_dim)
    rope = (spec((s.batch, s.seq, s.heads, s.head_dim)), spec((s.seq, s.head_dim // 2), f32))
    rope = (*rope, rope[1])
    ce = (spec((s.rows, s.vocab)), spec((s.rows, 1), f32))
    lse_rows = spec((s.rows, 1), f32)
    att = (spec(qkv), spec(kv), spec(kv))
    coeffs = ((3.4445, -4.775, 2.0315),) * 5
    return [
        ("relu2 fwd", "relu2", "relu2_fwd", (spec((s.rows, 4 * s.width)),)),
        ("relu2 bwd", "relu2", "relu2_bwd", (spec((s.rows, 4 * s.width)),) * 2),
        ("rmsnorm fwd", "rmsnorm", "rmsnorm_fwd", (spec((s.rows, s.width)), 1e-6)),
        (
            "rmsnorm bwd",
            "rmsnorm",
            "rmsnorm_bwd",
            (spec((s.rows, s.width)), spec((s.rows, s.width)), lse_rows),
        ),
        ("rope_qknorm fwd", "rope_qknorm", "rope_qknorm_fwd", (*rope, 1e-6, True)),
        (
            "rope_qknorm bwd",
            "rope_qknorm",
            "rope_qknorm_bwd",
            (rope[0], rope[0], rope[1], rope[2], _rope_rstd(s), True),
        ),
        ("cross_entropy fwd", "cross_entropy", "cross_entropy_fwd", (*ce, 15.0)),
        (
            "cross_entropy bwd",
            "cross_entropy",
            "cross_entropy_bwd",
            (*ce, lse_rows, lse_rows, 15.0),
        ),
        ("attention fwd", "attention", "attention_fwd", (*att, s.head_dim**-0.5)),
        (
            "attention bwd",
            "attention_bwd",
            "attention_bwd",
            (*att, spec(qkv), spec(qkv), spec((*qkv[:3], 1), f32), s.head_dim**-0.5),
        ),
        (
            "polar_express",
            "polar_express",
            "polar_express_fwd",
            (spec((1, s.width, 4 * s.width)), coeffs, 1e-7),
        ),
    ]


def _rope_rstd(s: Shapes) -> ArgSpec:
    """The rope forward's saved rstd, in the layout the kernel file declares."""
    module = load_kernel_module("rope_qknorm")
    layout = getattr(module, "RSTD_LAYOUT", "bhT1")
    if layout == "bTh":
        return spec((s.batch, s.seq, s.heads), "float32")
    return spec((s.batch, s.heads, s.seq, 1), "float32")


def table(shapes: Shapes, lnc: int = 2) -> list[dict[str, Any]]:
    """One row per kernel: the busiest program's budget summary."""
    rows = []
    for label, name, fn, args in cases(shapes):
        kernel = getattr(load_kernel_module(name), fn)
        budgets = kernel[lnc].trace(*args)
        worst = max(budgets, key=lambda b: b.bound_us)
        rows.append({"kernel": label, **worst.summary()})
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    head = (
        "| kernel | instructions | DMAs | bytes/DMA/partition min, median | DMAs < 2 KiB "
        "| busiest engine, est. us |\n| --- | --- | --- | --- | --- | --- |\n"
    )
    lines = [
        f"| {r['kernel']} | {r['instructions']:,} | {r['dmas']:,} | "
        f"{r['dma_bytes_per_partition_min']:,}, {r['dma_bytes_per_partition_median']:,} | "
        f"{r['dmas_under_2KiB']:,} | {r['bound_engine']} {r['bound_us']:,.0f} |"
        for r in rows
    ]
    return head + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--lnc", type=int, default=2)
    args = parser.parse_args(argv)
    rows = table(Shapes(), args.lnc)
    sys.stdout.write((json.dumps(rows, indent=1) if args.json else markdown(rows)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
