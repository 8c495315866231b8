"""The inputs `trnf doctor --kernels` runs each kernel on: a recipe's shapes, or a small
slice of them where the kernels can only run under the NumPy interpreter.

Each case is one ``trnf::`` op through its ops-compatible function (the model's call),
forward and, where the op has one, backward, so the kernel and the reference take the
exact same route as in training.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from trnfrontier.runtime.kernels import custom_ops


@dataclass(frozen=True)
class Shapes:
    """The model dimensions the kernels see in one training step of one process."""

    rows: int  # batch x sequence positions
    batch: int
    seq: int
    width: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    softcap: float

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def recipe_shapes(recipe: Any) -> Shapes:
    """The training-step shapes of a validated recipe."""
    m = recipe.model
    width = m.resolved_n_embd()
    heads = m.n_head if m.n_head is not None else width // m.head_dim
    kv_heads = m.n_kv_head if m.n_kv_head is not None else heads
    batch, seq = recipe.data.batch_size, m.sequence_len
    return Shapes(
        batch * seq, batch, seq, width, heads, kv_heads, m.head_dim, m.vocab_size, m.softcap
    )


def interpreter_shapes(full: Shapes) -> Shapes:
    """A small slice of ``full`` the interpreter runs in seconds, keeping the awkward
    parts: a ragged row tile (130 rows), GQA when the recipe has it, vocab > one chunk."""
    kv = 1 if full.kv_heads < full.heads else 2
    return Shapes(
        rows=130,
        batch=1,
        seq=130,
        width=min(full.width, 64),
        heads=2,
        kv_heads=kv,
        head_dim=min(full.head_dim, 32),
        vocab=min(full.vocab, 600),
        softcap=full.softcap,
    )


@dataclass(frozen=True)
class Case:
    kernel: str
    fn: Callable[..., torch.Tensor]
    inputs: tuple[torch.Tensor, ...]
    backward: bool
    bf16_inside: bool = False  # the op computes in bfloat16 whatever its input dtype


def _angles(s: Shapes, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    pos = torch.arange(s.seq, dtype=torch.float32, device=device)[:, None]
    freq = 10000.0 ** (-torch.arange(0, s.head_dim, 2, device=device).float() / s.head_dim)
    ang = pos * freq[None, :]
    return ang.cos()[None, None], ang.sin()[None, None]


def cases(s: Shapes, device: torch.device, dtype: torch.dtype, seed: int = 0) -> list[Case]:
    """One case per kernel at shapes ``s`` (fresh random inputs from ``seed``)."""
    gen = torch.Generator().manual_seed(seed)

    def mk(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)

    cos, sin = _angles(s, device)
    targets = torch.randint(0, s.vocab, (s.rows,), generator=gen).to(device)
    cap = s.softcap

    def rope(x: torch.Tensor) -> torch.Tensor:
        return custom_ops.rotary_rms_norm(x, cos, sin)

    def ce(z: torch.Tensor) -> torch.Tensor:
        return custom_ops.softcapped_cross_entropy(z, targets, cap)

    def polar(g: torch.Tensor) -> torch.Tensor:
        return custom_ops.polar_express(g)

    return [
        Case("relu2", custom_ops.relu_squared, (mk(s.rows, 4 * s.width),), True),
        Case("rmsnorm", custom_ops.rms_norm, (mk(s.rows, s.width),), True),
        Case("rope_qknorm", rope, (mk(s.batch, s.heads, s.seq, s.head_dim),), True),
        Case("cross_entropy", ce, (mk(s.rows, s.vocab, scale=4.0),), True),
        Case(
            "attention",
            custom_ops.causal_attention,
            (
                mk(s.batch, s.heads, s.seq, s.head_dim),
                mk(s.batch, s.kv_heads, s.seq, s.head_dim),
                mk(s.batch, s.kv_heads, s.seq, s.head_dim),
            ),
            True,
        ),
        # Muon's iteration runs in bfloat16 on accelerators, the kernel likewise
        Case("polar_express", polar, (mk(s.width, 4 * s.width, scale=0.02),), False, True),
    ]
